package modelserver

import (
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/backoff"
)

// waits is the one policy for every wait the backend takes between
// requests: the growing, jittered waits it chooses itself (a transient
// failure's retry, an overload that names no wait), the jitter that spreads
// subscribers waking for the same refill, and the ceiling on any wait a
// server asks for (Config.MaxServerWait), which it counts and logs when it
// applies. Every other part asks it rather than computing a wait of its
// own.
type waits struct {
	ceiling time.Duration
	log     *slog.Logger
	capped  *prometheus.CounterVec
}

// The growing waits: doubling from the first to the most over the attempts
// in a row, less up to a fifth of jitter (backoff.Policy) so that
// subscribers do not come back together.
var (
	overloadWaits  = backoff.Policy{First: time.Second, Max: 30 * time.Second, Jitter: growJitter}           // after an overload answer that names no wait
	transientWaits = backoff.Policy{First: 500 * time.Millisecond, Max: 8 * time.Second, Jitter: growJitter} // the SDKs' first retry delay
)

const (
	growJitter = 0.2
	// spreadJitter is the share added to a wait for a rate limit's refill:
	// subscribers that read the same remaining count would all wake at
	// the same moment for it.
	spreadJitter = 0.1
)

func newWaits(ceiling time.Duration, log *slog.Logger) *waits {
	return &waits{ceiling: ceiling, log: log, capped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vramq_subscriber_model_server_waits_capped_total",
		Help: "Waits the model server asked for (Retry-After, retry-after-ms, x-ratelimit-reset-*, or a refill its rate-limit headers imply) " +
			"that were past -model-server-max-server-wait and were cut to it, by the header they came from.",
	}, []string{"header"})}
}

// retry is the wait before the n-th retry (from 1) of a transient failure.
func (w *waits) retry(n int) time.Duration { return transientWaits.Delay(n) }

// overload is the wait after the n-th overload answer in a row (from 0)
// that named no wait.
func (w *waits) overload(n int) time.Duration { return overloadWaits.Delay(n + 1) }

// spread is d and up to a tenth more, at random.
func (w *waits) spread(d time.Duration) time.Duration {
	return d + time.Duration(rand.Float64()*spreadJitter*float64(d))
}

// server is a wait the server asked for in header (raw is its value, for
// the log), cut to the ceiling.
func (w *waits) server(d time.Duration, header, raw string) time.Duration {
	if d <= w.ceiling {
		return d
	}
	w.capped.WithLabelValues(header).Inc()
	w.log.Warn("the model server asked for a wait past -model-server-max-server-wait: waiting that long instead",
		"header", header, "value", clip(raw, maxServerString), "asked", d, "waiting", w.ceiling)
	return w.ceiling
}
