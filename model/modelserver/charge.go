package modelserver

import (
	"math"
	"net/http"
	"slices"
	"time"
)

// What a server's token limit charges a request. OpenAI and Azure OpenAI
// charge prompt + max_tokens × n when the request arrives (Azure's quota
// page: "the maximum tokens estimated to be processed"); LiteLLM's proxy
// limiter and most gateways that count usage per minute add the answer's
// usage.total_tokens (prompt + completion) once it is answered
// (litellm/proxy/hooks/parallel_request_limiter.py, async_log_success_event).
// The headers do not say which, and reserving max_tokens against a limiter
// that counts usage leaves its limit unused by the output not generated
// (0.920–0.929 of LiteLLM's own measure in bench/modelserver.md, outputs
// averaging 70% of max_tokens).
//
// So it is learned, from how the server's remaining count moves between
// two successful answers of this process, i and j (j read later), while
// alone on the limit (others' use explains anything). No limiter gives
// back less than it charged, so the count falls by at most what it
// charged between the two readings (D = remaining_i − remaining_j):
//
//   - charged at arrival, at most the arrival charges of this process's
//     sends that may have reached the server between them (an answered
//     send's latest arrival is its answer dated back by its processing time,
//     an unanswered one's its reservation + arrivalLag, as ownHeld takes
//     them);
//   - charged by usage, at most the usage of the answers read between them
//     (and of i's and those read a transit before it, which a gateway may
//     count after writing i's headers; and, at their arrival charge, of
//     those not read yet, which it may have counted before writing j's).
//
// Each answer is weighed once every send reserved before it was read is
// known to have reached the server (its answer read, or arrivalLag past),
// so that the first bound counts what the sends did.
//
// A fall past the first bound that the second allows is evidence of a
// limiter that counts usage: an answer counted while nothing of this
// process can have arrived. usageEvidence of them, none against between,
// make the reservation follow usage; a fall past the second bound (or a
// 429, or others on the limit) puts it back at arrival at once. Arrival is the
// default and the safe guess: a limiter charging at arrival never shows
// the first evidence to a lone process, so OpenAI's and Azure's keep their
// reservation of max_tokens.
//
// Following usage, a request reserves its prompt + usageQuantile of the
// output lengths its prompt-length cohort was answered with (outputs, the
// lengths the KV charge learns; max_tokens until outputSamples are in),
// and is counted at its real usage once answered, more than it reserved
// too: what a request generates past its reservation the lone mirror's
// floor and an own bucket take back from the room, so the pace absorbs it.
const (
	usageEvidence = 4
	usageQuantile = 0.9
)

// chargeBasis is what rates learned of its server's token charge. r.mu
// guards it.
type chargeBasis struct {
	byUsage bool
	score   int // evidence of usage since the last against it
}

// countsUsage is whether the server's token limit was learned to charge by
// usage, not at arrival.
func (r *rates) countsUsage() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.basis.byUsage
}

// byArrival puts the charge back at arrival, for why. r.mu is held.
func (r *rates) byArrival(why string) {
	r.basis.score = 0
	if r.basis.byUsage {
		r.basis.byUsage = false
		r.log.Info("the model server's token limit is taken to charge max_tokens at arrival again", "reason", why)
	}
}

// chargedAs counts the answered send seq at what the server charged, and
// learns from the counts the answers showed (chargeBasis): by usage its
// prompt + completion (used), at arrival its prompt + floor (as charged).
// h is its answer's headers, read at now (its body is read by then, a
// moment after them). r.mu is held.
func (r *rates) chargedAs(b *bucket, seq uint64, arrival, used float64, h http.Header, now time.Time) {
	i := slices.IndexFunc(b.own, func(s sent) bool { return s.seq == seq })
	if i < 0 {
		return
	}
	s := &b.own[i]
	s.arrival, s.used = arrival, used
	if remaining, ok := headerNumber(h, "x-ratelimit-remaining-tokens"); ok {
		s.readAt, s.remaining = now, remaining
	}
	if r.basis.byUsage && used > 0 {
		s.tokens = used
	} else {
		s.tokens = math.Min(s.tokens, arrival)
	}
	r.learnCharges(b, now)
}

// learnCharges weighs each answer not yet weighed whose reading can be:
// every send reserved before it was read has reached the server by what
// is known of it (arrivedBy), so that the bounds are what the sends did,
// not what they might yet do. r.mu is held.
func (r *rates) learnCharges(b *bucket, now time.Time) {
	if !b.lone() || b.shared(now) {
		r.byArrival("others use the limit")
		return
	}
	var open time.Time // the first send not known to have reached the server
	for _, s := range b.own {
		if s.seen.IsZero() && now.Sub(s.at) < arrivalLag {
			open = s.at
			break
		}
	}
	for k := range b.own {
		j := &b.own[k]
		if j.readAt.IsZero() || j.used <= 0 || j.weighed || (!open.IsZero() && !j.readAt.Before(open)) {
			continue
		}
		j.weighed = true
		r.weigh(b, *j, now)
	}
}

// weigh weighs the fall of the remaining count from the answer read before
// j's to j's (chargeBasis). r.mu is held.
func (r *rates) weigh(b *bucket, j sent, now time.Time) {
	var prev *sent
	for k := range b.own {
		s := &b.own[k]
		if !s.readAt.IsZero() && s.readAt.Before(j.readAt) && (prev == nil || s.readAt.After(prev.readAt)) {
			prev = s
		}
	}
	if prev == nil {
		return
	}
	fall := prev.remaining - j.remaining
	from := prev.readAt.Add(-transit)
	var arrived, used float64
	for _, s := range b.own {
		if !s.at.After(j.readAt) && arrivedBy(s, now).After(from) {
			arrived += s.arrivalCharge()
		}
		switch {
		case s.readAt.IsZero() && !s.at.After(j.readAt):
			// Not read yet: its usage may have been counted before
			// j's headers were written, which were read first.
			used += s.arrivalCharge()
		case s.readAt.After(from) && !s.readAt.After(j.readAt.Add(transit)):
			used += s.usageCharge()
		}
	}
	tol := math.Max(4, 0.05*r.typical)
	switch {
	case fall > used+tol:
		r.byArrival("its remaining count fell past this process's usage")
	case fall > arrived+tol:
		if r.basis.score++; r.basis.score >= usageEvidence && !r.basis.byUsage {
			r.basis.byUsage = true
			r.log.Info("the model server's token limit is taken to charge usage (prompt + completion tokens), not max_tokens: "+
				"its remaining count falls as answers come, not as requests arrive", "fall", fall, "arrivals", arrived)
		}
	}
}

// arrivedBy is the latest s may have reached the server, as of now.
func arrivedBy(s sent, now time.Time) time.Time {
	latest := s.at.Add(arrivalLag)
	if !s.seen.IsZero() {
		latest = s.seen
	}
	if now.Before(latest) {
		latest = now
	}
	return latest
}

// arrivalCharge is what a limiter charging at arrival took for s: its
// prompt + max output once answered, its reservation before (which is
// that, or more, while the charge is taken at arrival).
func (s sent) arrivalCharge() float64 {
	if s.arrival > 0 {
		return s.arrival
	}
	return s.tokens
}

// usageCharge is what a limiter counting usage took for s: its usage once
// its body is read; until then, at most its arrival charge.
func (s sent) usageCharge() float64 {
	if s.used > 0 {
		return s.used
	}
	return s.arrivalCharge()
}

// tokens is r's rate reservation: prompt plus max output × choices, what a
// server's token limit charging at arrival takes; against one that counts
// usage (rates.countsUsage), prompt plus usageQuantile of the outputs of
// r's cohort (of its kind until the cohort has outputSamples answers),
// never more than that.
func (m *Model) tokens(r *request) int64 {
	prompt := m.counter.tokens(r.kind(), r.prompt)
	worst := prompt + r.maxOut*r.choices
	if r.ep == embeddings || !m.rates.countsUsage() {
		return worst
	}
	q, ok := m.outputs.quantile(cohort(r), usageQuantile, r.maxOut)
	if !ok {
		q, ok = m.outputs.quantile(r.kind(), usageQuantile, r.maxOut)
	}
	if !ok {
		return worst
	}
	return min(worst, prompt+q*r.choices)
}

// quantile is the q-quantile of the output tokens of one sequence of kind,
// each capped at maxOut. ok is false short of outputSamples answers.
func (o *outputs) quantile(kind string, q float64, maxOut int64) (int64, bool) {
	o.mu.Lock()
	k := o.kinds[kind]
	if k == nil || len(k.l) < outputSamples || maxOut <= 0 {
		o.mu.Unlock()
		return 0, false
	}
	l := slices.Clone(k.l)
	o.mu.Unlock()
	slices.Sort(l)
	return min(maxOut, l[min(len(l)-1, int(math.Ceil(q*float64(len(l))))-1)]), true
}
