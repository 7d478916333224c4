package fakeoai

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// work is a model request, parsed and checked.
type work struct {
	path      string
	model     string
	inputs    []input // the chat prompt, the completion prompts or the embedding inputs
	prompt    int     // usage.prompt_tokens
	maxTokens int     // per choice; 0 for embeddings
	n         int
	bestOf    int // completions' best_of, which Azure's estimate counts
	priority  int // vLLM's, for PriorityScheduling
	dim       int
	base64    bool
	stops     []string // /v1/messages' stop_sequences
}

type input struct {
	text   string
	tokens int
}

// embeddings reports whether wk generates nothing: an embedding's or a
// moderation's inputs are read once each, as TEI reads them.
func (wk *work) embeddings() bool { return wk.path == "/v1/embeddings" || wk.path == "/v1/moderations" }

// cost is what the request takes from the TPM bucket: prompt tokens plus
// max_tokens for each choice of each prompt.
func (wk *work) cost() int { return wk.prompt + wk.maxTokens*wk.n*len(wk.inputs) }

// badRequest is a 400 (or another status) found while parsing.
type badRequest struct {
	status        int
	msg, param    string
	code, format  string // format "tgi" or "tei" for their bodies
	contextLength bool
}

func invalid(param, format string, a ...any) *badRequest {
	return &badRequest{status: http.StatusBadRequest, msg: fmt.Sprintf(format, a...), param: param}
}

func (b *badRequest) write(w http.ResponseWriter) {
	switch b.format {
	case "tgi":
		writeTGI(w, b.status, b.msg, "validation")
		return
	case "tei":
		writeTEIOpenAI(w, b.status, b.msg, "validation")
		return
	case "anthropic":
		writeAnthropic(w, b.status, anthropicType(b.status), b.msg)
		return
	}
	writeOpenAI(w, b.status, b.msg, "invalid_request_error", b.param, b.code)
}

// serveModel answers the three model routes.
func (s *Server) serveModel(rw http.ResponseWriter, r *http.Request) {
	w := &answer{ResponseWriter: rw, s: s, start: time.Now()}
	recorded := true
	defer func() {
		if recorded {
			s.record(w.status)
		}
	}()

	s.mu.Lock()
	s.stats.Requests++
	fault := s.pickFault(r.URL.Path)
	limit := s.cfg.PayloadLimit
	s.mu.Unlock()
	if fault != nil {
		w.extra = fault.Header
		switch fault.Kind {
		case FaultDrop:
			w.drop()
			return
		case FaultStatus, FaultNotJSON:
			s.writeFault(w, fault)
			return
		}
	}
	if !s.authorized(w, r) {
		return
	}
	var body []byte
	var err error
	if limit > 0 {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			// axum's DefaultBodyLimit, in front of TEI's routes.
			writePlain(w, http.StatusRequestEntityTooLarge, "Failed to buffer the request body: length limit exceeded")
			return
		}
	} else {
		body, err = io.ReadAll(r.Body)
	}
	if err != nil {
		recorded = false // the client went away
		return
	}

	wk, bad := s.parse(r.URL.Path, body)
	if bad != nil && bad.format == "" && r.URL.Path == "/v1/messages" {
		bad.format = "anthropic"
	}
	if bad != nil {
		if bad.contextLength {
			s.count(func(st *Stats) { st.ContextLength++ })
		}
		bad.write(w)
		return
	}

	// The front door: quota, then rate limits.
	s.mu.Lock()
	now := s.clock.now()
	if s.limits.exhausted {
		s.stats.QuotaRejected++
		s.mu.Unlock()
		writeOpenAI(w, http.StatusTooManyRequests,
			"You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
			"insufficient_quota", "", "insufficient_quota")
		return
	}
	cost := s.limits.cost(wk)
	if rej := s.limits.admit(cost, now); rej != nil {
		if rej.wait > 0 {
			s.stats.RateLimited++
			s.minute(now).RateLimited++
		} else {
			s.stats.TooLarge++
		}
		// The body is made under the lock (it reads the counts); the
		// answer's headers take the lock again.
		rw := &heldAnswer{header: http.Header{}}
		s.limits.write(rw, rej, wk, now, s.clock)
		s.mu.Unlock()
		rw.replay(w)
		return
	}
	s.stats.Admitted++
	s.stats.AdmittedTokens += int64(cost)
	m := s.minute(now)
	m.Requests++
	m.Tokens += int64(cost)
	s.second(now).Tokens += int64(cost)

	// The server behind: TGI's concurrency, vLLM's queue, then the scheduler.
	seqs := len(wk.inputs)
	if !wk.embeddings() {
		seqs *= wk.n
	}
	if c := s.cfg.MaxConcurrentRequests; c > 0 && s.inflight >= c {
		s.stats.Overloaded++
		s.mu.Unlock()
		if wk.embeddings() {
			writeTEIOpenAI(w, http.StatusTooManyRequests, "Model is overloaded", "overloaded")
		} else {
			writeTGI(w, http.StatusTooManyRequests, "Model is overloaded", "overloaded")
		}
		return
	}
	if q := s.cfg.MaxQueuedRequests; q > 0 && len(s.running)+len(s.waiting)+seqs > q {
		s.stats.QueueFull++
		inQueue := len(s.running) + len(s.waiting)
		s.mu.Unlock()
		writeOpenAI(w, http.StatusServiceUnavailable,
			fmt.Sprintf("The server is at capacity: %d sequences in flight, %d asked, --max-num-queued-reqs %d.", inQueue, seqs, q),
			"server_error", "", "")
		return
	}
	g := s.jobs(wk)
	s.enqueue(g)
	s.mu.Unlock()

	select {
	case <-g.done:
	case <-r.Context().Done():
		s.mu.Lock()
		g.aborted = true
		s.inflight--
		s.mu.Unlock()
		recorded = false
		return
	case <-s.quit:
		writeOpenAI(w, http.StatusServiceUnavailable, errClosed.Error(), "server_error", "", "")
		return
	}

	completionTokens := 0
	for _, j := range g.jobs {
		completionTokens += j.length
	}
	s.mu.Lock()
	s.inflight--
	now = s.clock.now()
	s.limits.answered(wk.prompt+completionTokens, now)
	m = s.minute(now)
	m.PromptTokens += int64(wk.prompt)
	m.CompletionTokens += int64(completionTokens)
	s.second(now).Used += int64(wk.prompt + completionTokens)
	s.stats.PromptTokens += int64(wk.prompt)
	s.stats.CompletionTokens += int64(completionTokens)
	s.ids++
	id := s.ids
	s.mu.Unlock()

	b := s.render(wk, g, id, now.Unix(), completionTokens)
	if fault != nil && fault.Kind == FaultDropAfter {
		w.drop()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Set("openai-model", wk.model)
	if fault != nil && fault.Kind == FaultSlowBody {
		half := len(b) / 2
		w.Write(b[:half])
		w.Flush()
		if !s.clock.sleep(fault.Delay, s.quit) {
			return
		}
		b = b[half:]
	}
	w.Write(b)
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.stats)
}

// jobs makes the sequences of wk: one per choice of each prompt, or one per
// embedding input. s.mu is held.
func (s *Server) jobs(wk *work) *group {
	g := &group{priority: wk.priority}
	now := s.clock.now()
	for _, in := range wk.inputs {
		if wk.embeddings() {
			g.jobs = append(g.jobs, &job{group: g, prompt: in.tokens, arrived: now})
			continue
		}
		hashes := s.blockHashes(in.text, in.tokens)
		for c := range wk.n {
			natural := max(1, s.cfg.OutputTokens(in.text, c))
			g.jobs = append(g.jobs, &job{group: g, prompt: in.tokens, natural: natural, length: min(wk.maxTokens, natural), hashes: hashes,
				arrived: now})
		}
	}
	return g
}

// render is the 200 answer's body.
func (s *Server) render(wk *work, g *group, id uint64, created int64, completionTokens int) []byte {
	total := wk.prompt + completionTokens
	var v any
	switch wk.path {
	case "/v1/messages":
		v = renderMessage(wk, g, id, completionTokens)
	case "/v1/responses":
		v = renderResponse(wk, g, id, created, completionTokens)
	case "/v1/moderations":
		v = renderModeration(wk, id)
	case "/v1/chat/completions":
		c := chatCompletion{ID: fmt.Sprintf("chatcmpl-fakeoai%012d", id), Object: "chat.completion", Created: created,
			Model: wk.model, ServiceTier: "default", SystemFingerprint: "fp_fakeoai",
			Usage: usage{PromptTokens: wk.prompt, CompletionTokens: &completionTokens, TotalTokens: total}}
		for i, j := range g.jobs {
			c.Choices = append(c.Choices, chatChoice{Index: i, FinishReason: j.finishReason(),
				Message: assistantOutput{Role: "assistant", Content: outputText(wk.inputs[0].text, i, j.length)}})
		}
		v = c
	case "/v1/completions":
		c := completion{ID: fmt.Sprintf("cmpl-fakeoai%012d", id), Object: "text_completion", Created: created,
			Model: wk.model, SystemFingerprint: "fp_fakeoai",
			Usage: usage{PromptTokens: wk.prompt, CompletionTokens: &completionTokens, TotalTokens: total}}
		for i, j := range g.jobs {
			in, choice := wk.inputs[i/wk.n], i%wk.n
			c.Choices = append(c.Choices, completionChoice{Index: i, FinishReason: j.finishReason(),
				Text: outputText(in.text, choice, j.length)})
		}
		v = c
	default:
		l := embeddingList{Object: "list", Model: wk.model, Usage: usage{PromptTokens: wk.prompt, TotalTokens: wk.prompt}}
		for i, in := range wk.inputs {
			vec := Embed(in.text, wk.dim)
			d := embeddingData{Object: "embedding", Index: i, Embedding: vec}
			if wk.base64 {
				buf := make([]byte, 4*len(vec))
				for k, x := range vec {
					binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(float32(x)))
				}
				d.Embedding = base64.StdEncoding.EncodeToString(buf)
			}
			l.Data = append(l.Data, d)
		}
		v = l
	}
	return marshal(v)
}

// parse reads and checks a model request.
func (s *Server) parse(path string, body []byte) (*work, *badRequest) {
	s.mu.Lock()
	cfg := s.cfg
	s.mu.Unlock()
	if !json.Valid(body) || len(strings.TrimSpace(string(body))) == 0 || strings.TrimSpace(string(body))[0] != '{' {
		return nil, invalid("", "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)")
	}
	wk := &work{path: path, n: 1}
	var stream bool
	var maxTokens *int
	var n *int
	switch path {
	case "/v1/messages":
		var bad *badRequest
		if maxTokens, stream, bad = parseMessages(wk, body); bad != nil {
			return nil, bad
		}
	case "/v1/responses":
		var bad *badRequest
		if maxTokens, stream, bad = parseResponses(wk, body); bad != nil {
			return nil, bad
		}
	case "/v1/moderations":
		if bad := parseModerations(wk, body); bad != nil {
			return nil, bad
		}
	case "/v1/chat/completions":
		var req chatRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, invalid("", "Invalid request body: %v", err)
		}
		if len(req.Messages) == 0 {
			return nil, &badRequest{status: http.StatusBadRequest, msg: "Missing required parameter: 'messages'.", param: "messages", code: "missing_required_parameter"}
		}
		msgs := make([]Message, len(req.Messages))
		texts := make([]string, len(req.Messages))
		for i, m := range req.Messages {
			text, err := messageText(m.Content)
			if err != nil {
				return nil, invalid(fmt.Sprintf("messages.[%d].content", i), "Invalid 'messages[%d].content': %v.", i, err)
			}
			msgs[i] = Message{Role: m.Role, Name: m.Name, Content: text}
			texts[i] = text
		}
		wk.model, stream, n, wk.priority = req.Model, req.Stream, req.N, req.Priority
		wk.prompt = ChatPromptTokens(msgs)
		wk.inputs = []input{{text: strings.Join(texts, "\n"), tokens: wk.prompt}}
		maxTokens = req.MaxCompletionTokens
		if maxTokens == nil {
			maxTokens = req.MaxTokens
		}
	case "/v1/completions":
		var req completionRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, invalid("", "Invalid request body: %v", err)
		}
		in, err := textInputs(req.Prompt)
		if err != nil {
			return nil, invalid("prompt", "Invalid 'prompt': %v.", err)
		}
		wk.model, stream, n, wk.inputs, wk.priority = req.Model, req.Stream, req.N, in, req.Priority
		if req.BestOf != nil {
			wk.bestOf = *req.BestOf
		}
		for _, i := range in {
			wk.prompt += i.tokens
		}
		maxTokens = req.MaxTokens
		if maxTokens == nil {
			sixteen := 16 // the completions API's default
			maxTokens = &sixteen
		}
	default:
		var req embeddingRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, invalid("", "Invalid request body: %v", err)
		}
		in, err := textInputs(req.Input)
		if err != nil {
			return nil, invalid("input", "Invalid 'input': %v.", err)
		}
		wk.model, wk.inputs, wk.dim = req.Model, in, cfg.EmbedDim
		for _, i := range in {
			wk.prompt += i.tokens
		}
		if req.Dimensions != nil {
			if *req.Dimensions < 1 {
				return nil, invalid("dimensions", "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got %d instead.", *req.Dimensions)
			}
			wk.dim = *req.Dimensions
		}
		switch req.EncodingFormat {
		case "", "float":
		case "base64":
			wk.base64 = true
		default:
			return nil, invalid("encoding_format", "Invalid value: '%s'. Supported values are: 'float' and 'base64'.", req.EncodingFormat)
		}
	}
	if wk.model == "" {
		return nil, &badRequest{status: http.StatusBadRequest, msg: "You must provide a model parameter.", param: "model"}
	}
	known := false
	for _, m := range cfg.Models {
		known = known || m == wk.model
	}
	if !known && path == "/v1/messages" {
		return nil, &badRequest{status: http.StatusNotFound, format: "anthropic", msg: "model: " + wk.model}
	}
	if !known {
		return nil, &badRequest{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", wk.model), code: "model_not_found"}
	}
	if stream {
		return nil, invalid("stream", "fakeoai does not stream: send stream false.")
	}
	if wk.embeddings() {
		if cfg.MaxClientBatch > 0 && len(wk.inputs) > cfg.MaxClientBatch {
			// TEI's ErrorType::Validation, a 413 on its OpenAI-compatible route.
			return nil, &badRequest{status: http.StatusRequestEntityTooLarge, format: "tei",
				msg: fmt.Sprintf("batch size %d > maximum allowed batch size %d", len(wk.inputs), cfg.MaxClientBatch)}
		}
		for _, in := range wk.inputs {
			if in.tokens > cfg.MaxModelLen {
				return nil, contextLength(cfg, in.tokens, 0, fmt.Sprintf("`inputs` must have less than %d tokens. Given: %d", cfg.MaxModelLen, in.tokens))
			}
		}
		return wk, nil
	}
	if n != nil {
		if *n < 1 || *n > 128 {
			return nil, invalid("n", "Invalid 'n': expected a value between 1 and 128, but got %d instead.", *n)
		}
		wk.n = *n
	}
	longest := 0
	for _, in := range wk.inputs {
		longest = max(longest, in.tokens)
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return nil, &badRequest{status: http.StatusBadRequest, param: "max_tokens", code: "integer_below_min_value",
				msg: fmt.Sprintf("Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got %d instead.", *maxTokens)}
		}
		wk.maxTokens = *maxTokens
	} else {
		wk.maxTokens = max(1, cfg.MaxModelLen-longest)
	}
	if longest+wk.maxTokens > cfg.MaxModelLen {
		return nil, contextLength(cfg, longest, wk.maxTokens, fmt.Sprintf(
			"`inputs` tokens + `max_new_tokens` must be <= %d. Given: %d `inputs` tokens and %d `max_new_tokens`", cfg.MaxModelLen, longest, wk.maxTokens))
	}
	return wk, nil
}

// contextLength is the answer to a sequence longer than MaxModelLen: TGI's
// 422 or OpenAI's 400.
func contextLength(cfg Config, prompt, completion int, tgi string) *badRequest {
	if cfg.ContextLengthStatus == http.StatusUnprocessableEntity {
		return &badRequest{status: http.StatusUnprocessableEntity, format: "tgi", contextLength: true, msg: "Input validation error: " + tgi}
	}
	return &badRequest{status: http.StatusBadRequest, param: "messages", code: "context_length_exceeded", contextLength: true,
		msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			cfg.MaxModelLen, prompt+completion, prompt, completion)}
}
