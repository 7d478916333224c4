package modelserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/wordpiece"
)

// Model is a model server as a backend.Backend: Run sends each item's request,
// Cost is what it holds of the server's KV cache, in tokens, Working the KV
// tokens of the requests in flight (gpu.WorkingSet). Safe for concurrent
// use.
type Model struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	base   string // the server's root, without /v1
	auth   string // the Authorization header; never logged
	name   string

	counter *counter
	outputs *outputs
	rates   *rates
	conc    *concurrency
	gate    *gate
	order   *prefixOrder
	online  *online // nil: online-first mode off
	stop    context.CancelFunc
	dev     *KV
	held    atomic.Int64 // KV tokens of the requests in flight
	took    requestTime  // of the requests answered ok, for Slots
	waits   *waits
	limits  job.RequestLimits // the rule's bounds for a request body (parse)

	embedCap atomic.Int64 // inputs per embeddings request, lowered by a 413
	capClean atomic.Int64 // full packs taken since the cap last changed

	mu      sync.Mutex
	answers map[string]int64 // answers by disposition row
}

// Open checks cfg, reads the key, asks the server which models it serves
// (GET /v1/models: a refused key or a missing route stops the start with a
// clear error) and what its KV cache holds (GET /metrics, vLLM's
// vllm:cache_config_info, when it answers), and returns the model, which
// owns its KV cache (Memory).
func Open(ctx context.Context, cfg Config) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.Models = slices.Clone(cfg.Models)
	if cfg.APIKeyFile != "" {
		b, err := os.ReadFile(cfg.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("modelserver: the API key file: %w", err)
		}
		cfg.APIKey = strings.TrimSpace(string(b))
		if cfg.APIKey == "" || strings.ContainsAny(cfg.APIKey, "\r\n") {
			return nil, fmt.Errorf("modelserver: the API key file %s: want one line with the key", cfg.APIKeyFile)
		}
	}
	u, _ := url.Parse(cfg.BaseURL)
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	w := newWaits(cfg.MaxServerWait, cfg.Logger)
	order := newPrefixOrder()
	rates := newRates(cfg.TPM, cfg.RPM, time.Now(), w)
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{w.capped, order.groups, order.warm, rates.paused} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("modelserver: metrics: %w", err)
			}
		}
	}
	m := &Model{
		cfg:     cfg,
		log:     cfg.Logger,
		client:  cfg.HTTPClient,
		base:    strings.TrimSuffix(u.String(), "/"),
		name:    "model-server:" + strings.Join(cfg.Models, ","),
		waits:   w,
		rates:   rates,
		gate:    newGate(w),
		order:   order,
		answers: map[string]int64{},
		limits: job.RequestLimits{Models: cfg.Models, MaxN: cfg.MaxN, MaxOutputTokens: cfg.MaxOutputTokens,
			AllowRemoteURLs: cfg.AllowRemoteURLs},
	}
	m.embedCap.Store(int64(cfg.EmbedBatch))
	if cfg.APIKey != "" {
		m.auth = "Bearer " + cfg.APIKey
	}
	if m.client == nil {
		m.client = newClient(cfg)
	}
	var wp *wordpiece.Tokenizer
	if cfg.Tokenizer != "" {
		var err error
		if wp, err = loadTokenizer(cfg.Tokenizer); err != nil {
			m.log.Warn("the tokenizer is not one this project runs: token counts are bounded from the bytes",
				"tokenizer", cfg.Tokenizer, "err", err)
		}
	}
	m.counter = newCounter(wp)
	m.outputs = newOutputs()

	if err := m.probeModels(ctx); err != nil {
		return nil, err
	}
	d := &KV{m: m, name: "model-server " + u.Host, share: 1}
	snap, err := m.readMetrics(ctx)
	switch {
	case err != nil:
		m.log.Info("the model server exports no vLLM metrics: its KV cache is not followed", "err", err)
	case snap.blocks > 0:
		d.live, d.snap, d.read = true, snap, time.Now()
	}
	// The pool, in tokens: what the server says it holds, else what it was
	// configured to, else the bound on what vramq has in flight.
	switch {
	case d.live:
		d.capacity = snap.blocks * snap.blockSize
	case cfg.KVCacheTokens > 0:
		d.capacity = cfg.KVCacheTokens
	default:
		d.capacity = cfg.TokensInFlight
	}
	m.dev = d
	if m.cfg.MaxConcurrency == 0 {
		m.cfg.MaxConcurrency = defaultConcurrency(d.live, snap.blocks)
		cfg.MaxConcurrency = m.cfg.MaxConcurrency
	}
	m.conc = newConcurrency(cfg.MaxConcurrency, cfg.Logger)
	m.online = newOnline(cfg.Online, cfg.MaxConcurrency, m.conc)
	if m.online != nil && cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.online.bound, m.online.givenWays} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("modelserver: metrics: %w", err)
			}
		}
	}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	m.stop = stop
	go m.online.run(bg, m)
	m.log.Info("model server ready", "config", cfg, "kv_cache_tokens", d.capacity,
		"kv_followed", d.live, "exact_tokens", wp != nil)
	return m, nil
}

// idleConns is the connections kept for reuse when MaxConcurrency is left
// to its default: more than a KV-bounded server runs at once in
// bench/modelserver.md (at most 92).
const idleConns = 256

func newClient(cfg Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = cfg.ConnectTimeout
	// Every request in flight keeps its connection for the next one. The
	// default concurrency is not known before the server's metrics are
	// read (defaultConcurrency); idle connections past idleConns are closed
	// and dialled again, which costs time, not correctness.
	idle := cfg.MaxConcurrency
	if idle == 0 {
		idle = idleConns
	}
	tr.MaxIdleConns = 2 * idle
	tr.MaxIdleConnsPerHost = 2 * idle
	return &http.Client{
		Transport: tr,
		// A redirect is an answer, not a place to send the key.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func loadTokenizer(path string) (*wordpiece.Tokenizer, error) {
	dir := path
	if fi, err := os.Stat(path); err != nil {
		return nil, err
	} else if !fi.IsDir() {
		if filepath.Base(path) != "tokenizer.json" {
			return nil, fmt.Errorf("%s: want a tokenizer.json or its directory", path)
		}
		dir = filepath.Dir(path)
	}
	return wordpiece.Load(dir)
}

// probeModels asks GET /v1/models and checks that it serves every model
// configured.
func (m *Model) probeModels(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ConnectTimeout+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.base+"/v1/models", nil)
	if err != nil {
		return fmt.Errorf("modelserver: %w", err)
	}
	if m.auth != "" {
		req.Header.Set("Authorization", m.auth)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return fmt.Errorf("modelserver: GET %s/v1/models: %w", redactURL(m.base), clipErr(err))
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%w: modelserver: GET %s/v1/models answered %s: the server refuses the API key (give it with the key's environment variable or file)",
			fault.ErrNeedsOperator, redactURL(m.base), resp.Status)
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("modelserver: GET %s/v1/models answered 404: is that the root of an OpenAI-compatible server?", redactURL(m.base))
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("modelserver: GET %s/v1/models answered %s", redactURL(m.base), clip(resp.Status, maxServerString))
	case json.Unmarshal(body, &list) != nil:
		return fmt.Errorf("modelserver: GET %s/v1/models: the answer is not a model list", redactURL(m.base))
	}
	served := make([]string, 0, len(list.Data))
	for _, d := range list.Data {
		served = append(served, d.ID)
	}
	shown := make([]string, 0, min(len(served), 21))
	for _, id := range served[:min(len(served), 20)] {
		shown = append(shown, clip(id, maxServerString))
	}
	if len(served) > 20 {
		shown = append(shown, "…")
	}
	var missing []string
	for _, name := range m.cfg.Models {
		if !slices.Contains(served, name) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("modelserver: the server does not serve %q; it serves %q", missing, shown)
	}
	return nil
}

// Name is "model-server:" and the configured models.
func (m *Model) Name() string { return m.name }

// Close stops online-first mode's readings and lets go of idle connections.
func (m *Model) Close() error {
	if m.stop != nil {
		m.stop()
	}
	m.client.CloseIdleConnections()
	return nil
}

// Memory is the server's KV cache, which bounds admission in Cost's unit,
// KV tokens.
func (m *Model) Memory() backend.Memory { return m.dev }

// Working is the KV tokens of the requests in flight, as the server's
// KV cache shows them: the least of their charges and what the cache
// holds in all at the last reading, so never above what is allocated on a
// server vramq has to itself (a sidecar). 0 when the cache is not
// followed: the pool's free tokens are then its capacity, constant, and
// the budget is that less the reserve.
func (m *Model) Working() int64 {
	d := m.dev
	if !d.live {
		return 0
	}
	d.mu.Lock()
	used := d.usedTokens()
	d.mu.Unlock()
	return min(m.held.Load(), used)
}

// Cost is the KV charges of items of a job that names endpoint ("" for
// none: the route is then told from each body, see endpointOf), in KV
// tokens (backend.KVTokens): an embeddings
// item's tokens; a generation's prompt (estimated) plus, once the server's
// cache is followed and answers of its kind have been seen, what its output
// holds of the cache on average while in flight (kvTokens), else the most
// it may generate (max_tokens × n). An item Run refuses without a request
// costs nothing.
func (m *Model) Cost(endpoint string, items []job.Item) int64 {
	var c int64
	for _, it := range items {
		r, refused := m.parse(endpoint, it)
		if refused != nil {
			continue
		}
		c += m.kvTokens(r)
	}
	return c
}

// Run sends the requests of items of a job that names endpoint and
// returns one output per item: the server's answer (Response) for a 2xx;
// an Error for an item refused, by the subscriber (invalid_input,
// too_large) or by the server (request_refused, with its Response). With
// an endpoint, every item is a request for it, whatever its body holds; an
// item whose body lacks what the endpoint requires is refused
// (invalid_input), and an endpoint that is not one of job.Endpoints refuses
// every item. Without one ("") each item's route is told from its body
// (see endpointOf). Chat and completion items are a request each;
// embedding items that agree on everything but their input share
// requests, within Config.EmbedBatch inputs and Config.EmbedBatchTokens
// tokens. The requests run concurrently, within the concurrency bound, the
// rate limits and the server's pauses.
//
// Run returns an error, and no outputs, when the batch cannot finish: one
// wrapping fault.ErrBackoff (the server's wait ends past Config.MaxWait from
// now; the outputs of the items that finished, those sent before it
// included, come in a fault.PartialError), fault.ErrNeedsOperator, gpu.ErrOutOfMemory (an embedding input the
// server cannot hold even alone), a transient failure past its retries, or
// ctx's error.
//
// Each answer of the server (an output with a Response) is also told to
// gpu.Answers(ctx), when set, as it arrives: the subscriber keeps it where a
// later run of the item finds it. The answers the subscriber holds already
// for the batch's results (gpu.Kept(ctx)) count against Config.ResultBytes
// as this run's own.
func (m *Model) Run(ctx context.Context, endpoint string, items []job.Item) ([]job.Output, error) {
	run := &run{outs: make([]job.Output, len(items)), deadline: time.Now().Add(m.cfg.MaxWait), limit: m.cfg.ResultBytes,
		left: max(0, m.cfg.ResultBytes-gpu.Kept(ctx)), told: gpu.Answers(ctx)}
	outs := run.outs
	var gens []*request
	groups := map[string][]*request{}
	var keys []string
	for i, it := range items {
		outs[i].ID = it.ID
		r, refused := m.parse(endpoint, it)
		if refused != nil {
			outs[i].Error = refused
			continue
		}
		r.idx = i
		if r.ep != embeddings {
			gens = append(gens, r)
			continue
		}
		if _, ok := groups[r.key]; !ok {
			keys = append(keys, r.key)
		}
		groups[r.key] = append(groups[r.key], r)
	}
	g := newGroup(ctx, ctx)
	for _, r := range gens {
		g.Go(func(sent, wait context.Context) error { return m.generate(sent, wait, r, run) })
	}
	for _, k := range keys {
		for _, p := range m.packs(groups[k]) {
			g.Go(func(sent, wait context.Context) error { return m.embed(sent, wait, p, run) })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, partial(err, outs)
	}
	return outs, nil
}

// generate runs one chat or completion item: its request under ctx, its
// waits for a turn under wait (see group).
func (m *Model) generate(ctx, wait context.Context, r *request, run *run) error {
	seq := m.outputs.begin(r.kind(), cohort(r))
	ep, body := r.ep, r.body
	if r.chat != nil {
		ep, body = chat, r.chat
	}
	o, err := m.send(ctx, wait, &call{ep: ep, body: m.online.mark(body), tokens: m.tokens(r), floor: r.prompt.exact + r.maxOut*r.choices,
		kv: m.kvTokens(r), most: run.room(), prefix: job.PrefixKey(r.ep.path(), r.body)}, run.deadline)
	if err != nil {
		m.outputs.end(seq, 0, 0)
		return m.itemErr(err, &run.outs[r.idx])
	}
	if o.row.action != actOK {
		m.outputs.end(seq, 0, 0)
	} else {
		u := usageOf(o.a.body)
		m.counter.observe(r.kind(), r.prompt, u.PromptTokens)
		m.outputs.end(seq, u.CompletionTokens, r.choices)
		if r.chat != nil {
			o.a.body = fromChat(o.a.body, r.stops)
		}
	}
	run.keep(r.idx, m.output(r.id, o))
	return nil
}

// run is one Run's outputs, its deadline, and what its answers may still
// take of Config.ResultBytes.
type run struct {
	outs     []job.Output
	deadline time.Time
	limit    int64
	told     func(int, job.Output) // gpu.Answers of Run's context, or nil

	mu   sync.Mutex
	left int64
}

// keep sets output i, its answer charged to what the run may keep: an
// answer past that fails its item instead (too_large), so that the outputs
// of one message stay within what its result may hold, however large the
// server's answers.
func (r *run) keep(i int, o job.Output) {
	if o.Response != nil {
		n := gpu.AnswerBytes(o)
		r.mu.Lock()
		over := n > r.left
		if !over {
			r.left -= n
		}
		r.mu.Unlock()
		if over {
			o = job.Output{ID: o.ID, Error: job.NewItemError(job.ItemTooLarge, fmt.Sprintf(
				"the server's answer of %d bytes is past what this message's result may still hold (%d bytes of answers in all)", n, r.limit))}
		}
	}
	r.outs[i] = o
	if r.told != nil && o.Response != nil {
		r.told(i, o) // paid for: the caller keeps it before the batch ends
	}
}

// room is what the run's answers may still take: no answer longer is
// worth reading whole.
func (r *run) room() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.left
}

// itemErr turns send's error into an item error where it is the item's (a
// request larger than a rate limit), or returns it.
func (m *Model) itemErr(err error, out *job.Output) error {
	var tl *tooLargeError
	if errors.As(err, &tl) {
		out.Error = job.NewItemError(job.ItemTooLarge, tl.Error())
		return nil
	}
	var te *timeoutError
	if errors.As(err, &te) {
		out.Error = job.NewItemError(job.ItemRequestTimeout, te.Error())
		return nil
	}
	return err
}

// output is an item's output for a settled answer.
func (m *Model) output(id string, o *outcome) job.Output {
	if o.a.cut > 0 {
		return job.Output{ID: id, Error: job.NewItemError(job.ItemTooLarge, fmt.Sprintf(
			"the server's answer is over %d bytes: past what this message's result may hold", o.a.cut))}
	}
	out := job.Output{ID: id, Response: &job.Response{StatusCode: o.a.status, Body: jsonBody(o.a.body)}}
	if o.row.action != actOK {
		out.Error = job.NewItemError(job.ItemRequestRefused, o.a.describe(true))
	}
	return out
}

// jsonBody is an answer's body as JSON: itself when it is JSON, else a
// JSON string of its first bytes (a proxy's page), so that the result can
// always be encoded.
func jsonBody(b []byte) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	const most = 4096
	if len(b) > most {
		b = b[:most]
	}
	s, _ := json.Marshal(strings.ToValidUTF8(string(b), "\uFFFD"))
	return s
}

// count records an answer's row.
func (m *Model) count(row *disposition) {
	m.mu.Lock()
	m.answers[row.name]++
	m.mu.Unlock()
}

// inflightRounds is the most rounds of the concurrency's requests the
// subscriber may have admitted at once to a server without KV metrics:
// one running, one ready to take each slot as it frees.
const inflightRounds = 2

// rateHorizonDiv makes what the subscriber may have admitted what the
// server can run, and the rate limits pass, in MaxWait/rateHorizonDiv: a
// batch admitted with that much ahead of it finishes within MaxWait, the
// other half left for the margin the mirrors keep and a limiter slower
// than it says.
const rateHorizonDiv = 2

// rateMost is the most rate tokens Offers ever offers: what it offers
// while no limit bounds them, past any limit a server has.
const rateMost = 1 << 50

var _ backend.Backend = (*Model)(nil)

// Offers is what the subscriber may have admitted to the server at once
// (backend.Offerer):
//
//   - backend.Slots, without KV metrics (TGI, TEI, Ollama, OpenAI: nothing
//     tells how full it is): what it can run within half of MaxWait, its
//     concurrency now (halved by an overload) times the rounds of
//     requests of the expected time (learned from its answers) that take
//     no longer, at least one and at most inflightRounds. More would not
//     run sooner: every request past the concurrency waits in this
//     process, while its message is held as running, out of reach of its
//     job's cancel (checked before a batch starts) and of other
//     subscribers; a chunk completes only once all its requests have, so
//     a job's progress would wait for the whole backlog; and a request
//     that cannot start until its batch's MaxWait is nearly spent backs
//     the batch off partway. With vLLM's metrics the KV cache bounds
//     admission (KV), and slots are not offered.
//   - backend.RateTokens: what the rate limits pass in half of MaxWait,
//     the configured ones (Config.TPM, RPM) from the start, the server's,
//     mirrored from its headers, once it has answered, as this process's
//     share of them: what the others' use, seen in the server's counts,
//     leaves it. Before the first answer, with no limit configured, the
//     concurrency's worth of requests at the output ceiling, at most
//     DefaultMaxConcurrency's (a concurrency that follows a KV cache is
//     thousands, and every message held was admitted at once); once the
//     server has answered with no limits, rateMost. A batch admitted
//     beyond what the limits pass before its MaxWait ends backs off
//     partway, its unfinished messages handed back and asked again; with
//     a queue's worth held, every batch would, over and over
//     (bench/modelserver.md, "Through the subscriber").
func (m *Model) Offers() (now, most backend.Vector) {
	if !m.dev.live {
		rounds := inflightRounds
		if t, ok := m.took.mean(); ok {
			rounds = min(inflightRounds, max(1, int((m.cfg.MaxWait/rateHorizonDiv)/t)))
		}
		now[backend.Slots] = int64(rounds * m.conc.now())
		most[backend.Slots] = int64(inflightRounds * m.cfg.MaxConcurrency)
	}
	h, maxOut := m.cfg.MaxWait/rateHorizonDiv, float64(m.cfg.MaxOutputTokens)
	tokens := math.Inf(1)
	if own, ok := m.rates.ownWithin(h, maxOut); ok {
		tokens = own
	}
	if learned, ok := m.rates.learnedWithin(h, float64(min(m.cfg.MaxConcurrency, DefaultMaxConcurrency))*maxOut); ok {
		tokens = math.Min(tokens, learned)
	}
	now[backend.RateTokens] = int64(math.Max(0, math.Min(tokens, rateMost)))
	most[backend.RateTokens] = rateMost
	return now, most
}

// Needs is what items take (backend.Offerer): a slot for each request, one
// per chat or completion item and one per EmbedBatch embedding inputs, and
// the rate tokens their requests reserve (Model.tokens: prompt plus max
// output × choices, or the expected output where the server's limit counts
// usage). Items refused without a request take nothing.
func (m *Model) Needs(endpoint string, items []job.Item) backend.Vector {
	var reqs, inputs, tokens int64
	for _, it := range items {
		r, refused := m.parse(endpoint, it)
		switch {
		case refused != nil:
			continue
		case r.ep == embeddings:
			inputs++
		default:
			reqs++
		}
		tokens += m.tokens(r)
	}
	per := int64(max(m.cfg.EmbedBatch, 1))
	var v backend.Vector
	v[backend.Slots] = reqs + (inputs+per-1)/per
	v[backend.RateTokens] = tokens
	return v
}
