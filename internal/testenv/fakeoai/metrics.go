package fakeoai

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// vllmMetrics exposes the scheduler as vLLM V1 names it
// (docs/usage/metrics.md): gauges and counters labelled with model_name and
// engine, and the cache configuration as an info gauge of value 1.
type vllmMetrics struct {
	s                                                   *Server
	running, waiting, kvUsage, preemptions, prompt, gen *prometheus.Desc
	prefixQueries, prefixHits                           *prometheus.Desc
	cacheInfo                                           *prometheus.Desc
}

func (s *Server) metricsHandler() http.Handler {
	labels := prometheus.Labels{"model_name": s.cfg.Models[0], "engine": "0"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, labels) }
	m := &vllmMetrics{
		s:           s,
		running:     d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:     d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:     d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		preemptions: d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		prompt:      d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		gen:         d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries: d("vllm:prefix_cache_queries_total",
			"Prefix cache queries, in terms of number of queried tokens."),
		prefixHits: d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		cacheInfo: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			[]string{"block_size", "num_gpu_blocks"}, prometheus.Labels{"engine": "0"}),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, s.ttft)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

func (m *vllmMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.running, m.waiting, m.kvUsage, m.preemptions, m.prompt, m.gen, m.prefixQueries, m.prefixHits, m.cacheInfo} {
		ch <- d
	}
}

func (m *vllmMetrics) Collect(ch chan<- prometheus.Metric) {
	s := m.s
	s.mu.Lock()
	running, waiting := len(s.running), len(s.waiting)
	usage := float64(s.used) / float64(s.cfg.NumGPUBlocks)
	if s.kvUsage != nil {
		usage = *s.kvUsage
	}
	pre, prompt, gen := s.stats.Preemptions, s.stats.PromptTokens, s.stats.CompletionTokens
	queries, hits := s.stats.PrefixQueryTokens, s.stats.PrefixHitTokens
	blocks, size := s.cfg.NumGPUBlocks, s.cfg.BlockSize
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(m.running, prometheus.GaugeValue, float64(running))
	ch <- prometheus.MustNewConstMetric(m.waiting, prometheus.GaugeValue, float64(waiting))
	ch <- prometheus.MustNewConstMetric(m.kvUsage, prometheus.GaugeValue, usage)
	ch <- prometheus.MustNewConstMetric(m.preemptions, prometheus.CounterValue, float64(pre))
	ch <- prometheus.MustNewConstMetric(m.prompt, prometheus.CounterValue, float64(prompt))
	ch <- prometheus.MustNewConstMetric(m.gen, prometheus.CounterValue, float64(gen))
	ch <- prometheus.MustNewConstMetric(m.prefixQueries, prometheus.CounterValue, float64(queries))
	ch <- prometheus.MustNewConstMetric(m.prefixHits, prometheus.CounterValue, float64(hits))
	ch <- prometheus.MustNewConstMetric(m.cacheInfo, prometheus.GaugeValue, 1, strconv.Itoa(size), strconv.Itoa(blocks))
}
