package fakeoai

import (
	"fmt"
	"net/http"
	"time"
)

// FaultKind is what an injected fault does.
type FaultKind string

const (
	// FaultStatus answers Status at once, with the body the server that
	// gives that status gives (see Fault.Status); nothing is charged.
	FaultStatus FaultKind = "status"
	// FaultDrop closes the connection before answering; nothing is charged.
	FaultDrop FaultKind = "drop"
	// FaultDropAfter serves the request (charged, generated, counted in
	// the ledger) and closes the connection instead of answering.
	FaultDropAfter FaultKind = "drop_after"
	// FaultSlowBody serves the request and stalls Delay halfway through
	// the body.
	FaultSlowBody FaultKind = "slow_body"
	// FaultNotJSON answers Status (200 when 0) with an HTML page, as a
	// proxy in front of a server might; nothing is charged.
	FaultNotJSON FaultKind = "not_json"
	// FaultHeader serves the request as usual and sets Header over the
	// answer's headers: a broken or hostile server's rate-limit headers,
	// say an x-ratelimit-limit-tokens of 1 on a request it admitted.
	FaultHeader FaultKind = "header"
)

// Fault is one fault to inject. Each POST to a model route is a candidate
// of the faults in order; the first that takes it applies. A fault lets
// Skip candidates pass, then takes each with probability Rate (0 means
// every one; the draws come from Config.Seed), at most Times times (0 = no
// limit).
type Fault struct {
	Kind FaultKind
	// Status of FaultStatus and FaultNotJSON. The body of a FaultStatus is
	// TGI's for 422, 424 and 429 ({"error":...,"error_type":...}: 429 is
	// "Model is overloaded"), axum's plain text for 413 (TEI), OpenAI's
	// error object for the others (500 server_error, 503 and 529 included).
	Status int
	// Message replaces the body's message of a FaultStatus, for example a
	// "CUDA out of memory" one.
	Message string
	// RetryAfter adds Retry-After and retry-after-ms to a FaultStatus
	// answer; the servers this double follows send none, so it is 0 unless
	// a test needs one.
	RetryAfter time.Duration
	// Delay is the stall of FaultSlowBody.
	Delay time.Duration
	// Header is set over the answer's headers, the rate-limit headers
	// included, for FaultHeader and FaultStatus: what no server this
	// double follows sends, for the tests of a broken or hostile one (a
	// Retry-After of years, a contradictory limit).
	Header http.Header
	// ErrType and ErrCode make a FaultStatus answer OpenAI's error object
	// with this type and code, whatever its status (an
	// insufficient_quota 429, or a hostile server's type of megabytes).
	ErrType, ErrCode string

	Rate  float64
	Skip  int
	Times int
	// Paths limits the fault to these routes, for example
	// "/v1/embeddings"; empty: every model route.
	Paths []string
}

func (f Fault) validate() error {
	switch f.Kind {
	case FaultStatus:
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("fakeoai: status fault %d: want an error status", f.Status)
		}
	case FaultNotJSON:
		if f.Status != 0 && (f.Status < 200 || f.Status > 599) {
			return fmt.Errorf("fakeoai: not-JSON fault status %d", f.Status)
		}
	case FaultSlowBody:
		if f.Delay <= 0 {
			return fmt.Errorf("fakeoai: slow-body fault delay %v: want positive", f.Delay)
		}
	case FaultHeader:
		if len(f.Header) == 0 {
			return fmt.Errorf("fakeoai: header fault without headers")
		}
	case FaultDrop, FaultDropAfter:
	default:
		return fmt.Errorf("fakeoai: fault kind %q", f.Kind)
	}
	if !(f.Rate >= 0 && f.Rate <= 1) || f.Skip < 0 || f.Times < 0 || f.RetryAfter < 0 {
		return fmt.Errorf("fakeoai: %s fault: rate %v, skip %d, times %d, retry after %v: want rate 0 to 1, the others 0 or more",
			f.Kind, f.Rate, f.Skip, f.Times, f.RetryAfter)
	}
	return nil
}

// armedFault is a Fault with what it has seen.
type armedFault struct {
	Fault
	seen, injected int
}

func (f *armedFault) applies(path string) bool {
	if len(f.Paths) == 0 {
		return true
	}
	for _, p := range f.Paths {
		if p == path {
			return true
		}
	}
	return false
}

// pickFault chooses the fault for a request to path, if any. s.mu is held.
func (s *Server) pickFault(path string) *Fault {
	for _, f := range s.faults {
		if !f.applies(path) || (f.Times > 0 && f.injected >= f.Times) {
			continue
		}
		f.seen++
		if f.seen <= f.Skip {
			continue
		}
		if f.Rate > 0 && f.Rate < 1 && s.rng.Float64() >= f.Rate {
			continue
		}
		f.injected++
		s.stats.Faults[f.Kind]++
		fc := f.Fault
		return &fc
	}
	return nil
}

// writeFault answers a FaultStatus or FaultNotJSON.
func (s *Server) writeFault(w http.ResponseWriter, f *Fault) {
	if f.RetryAfter > 0 {
		setRetryAfter(w.Header(), f.RetryAfter, s.clock)
	}
	if f.Kind == FaultNotJSON {
		status := f.Status
		if status == 0 {
			status = http.StatusOK
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		fmt.Fprintf(w, "<html><head><title>%d %s</title></head><body><center><h1>%d %s</h1></center><hr><center>nginx</center></body></html>\n",
			status, http.StatusText(status), status, http.StatusText(status))
		return
	}
	msg := f.Message
	if f.ErrType != "" || f.ErrCode != "" {
		writeOpenAI(w, f.Status, orDefault(msg, "injected by fakeoai"), f.ErrType, "", f.ErrCode)
		return
	}
	switch f.Status {
	case http.StatusRequestEntityTooLarge:
		if msg == "" {
			msg = "Failed to buffer the request body: length limit exceeded"
		}
		writePlain(w, f.Status, msg)
	case http.StatusUnprocessableEntity:
		writeTGI(w, f.Status, orDefault(msg, "Input validation error: injected by fakeoai"), "validation")
	case http.StatusFailedDependency:
		writeTGI(w, f.Status, orDefault(msg, "Request failed during generation: injected by fakeoai"), "generation")
	case http.StatusTooManyRequests:
		writeTGI(w, f.Status, orDefault(msg, "Model is overloaded"), "overloaded")
	case http.StatusServiceUnavailable:
		writeOpenAI(w, f.Status, orDefault(msg, "The server is overloaded or not ready yet."), "server_error", "", "")
	case 529:
		writeOpenAI(w, f.Status, orDefault(msg, "Overloaded"), "overloaded_error", "", "")
	default:
		typ := "server_error"
		if f.Status < 500 {
			typ = "invalid_request_error"
		}
		writeOpenAI(w, f.Status, orDefault(msg, "The server had an error while processing your request. Sorry about that!"), typ, "", "")
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
