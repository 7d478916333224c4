package modelserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/job"
)

// A pack is embedding items that share one request: bodies alike but for
// their input, whose inputs are concatenated into the request's input
// array. Each item's output is the server's answer cut to its own inputs:
// its data entries, indexed from 0, the rest of the answer as the server
// sent it, and its share of usage (its exact count when every input was
// counted exactly, otherwise the server's total apportioned by the
// estimates). An item alone in its request gets the server's body as it
// came.
type pack []*request

// embedCapGrowRun is the clean full packs after which a cap lowered by a
// 413 grows back one input.
const embedCapGrowRun = 64

// packs cuts a group of alike items into requests of at most the current
// input cap and Config.EmbedBatchTokens tokens; an item past either alone
// is a request of its own.
func (m *Model) packs(rs []*request) []pack {
	b := batcher.Bounds{Count: int(m.embedCap.Load()), Size: int64(m.cfg.EmbedBatchTokens)}
	groups := batcher.Cut(rs, b, func(r *request) (int, int64) { return len(r.inputs), m.counter.tokens(r.kind(), r.prompt) })
	out := make([]pack, len(groups))
	for i, g := range groups {
		out[i] = g
	}
	return out
}

func (p pack) inputs() int {
	n := 0
	for _, r := range p {
		n += len(r.inputs)
	}
	return n
}

// body is the request's JSON.
func (p pack) body() []byte {
	if len(p) == 1 {
		return p[0].body
	}
	var obj map[string]json.RawMessage
	_ = json.Unmarshal(p[0].body, &obj) // parse checked it
	var b strings.Builder
	b.WriteByte('[')
	for i, r := range p {
		for j, in := range r.inputs {
			if i+j > 0 {
				b.WriteByte(',')
			}
			b.Write(in)
		}
	}
	b.WriteByte(']')
	obj["input"] = json.RawMessage(b.String())
	out, _ := json.Marshal(obj)
	return out
}

// embed runs one pack, in halves where the server cannot take it whole or
// refuses it (to find whose input it refuses); its requests under ctx,
// their waits under wait (see group).
func (m *Model) embed(ctx, wait context.Context, p pack, run *run) error {
	var prompt estimate
	var tokens int64
	for _, r := range p {
		prompt = prompt.add(r.prompt)
		tokens += m.counter.tokens(r.kind(), r.prompt)
	}
	o, err := m.send(ctx, wait, &call{ep: embeddings, body: p.body(), tokens: tokens, floor: prompt.exact, kv: tokens,
		most: run.room()}, run.deadline)
	var tl *tooLargeError
	switch {
	case errors.As(err, &tl) && len(p) > 1:
		return m.halves(ctx, wait, p, run)
	case err != nil:
		return m.itemErr(err, &run.outs[p[0].idx])
	}
	switch o.row.action {
	case actOK:
		u := usageOf(o.a.body)
		m.counter.observe(p[0].kind(), prompt, u.PromptTokens)
		if len(p) == 1 {
			run.keep(p[0].idx, m.output(p[0].id, o))
			return nil
		}
		bodies, ok := m.cut(p, o.a.body, u)
		if !ok {
			// The answer does not hold one entry per input: no item can
			// have its own, and each says so.
			for _, r := range p {
				run.keep(r.idx, job.Output{ID: r.id, Response: &job.Response{StatusCode: o.a.status, Body: jsonBody(o.a.body)},
					Error: job.NewItemError(job.ItemRequestRefused, fmt.Sprintf("%s: the answer holds no embedding per input (%d inputs sent with other items')",
						o.a.statusText(), len(r.inputs)))})
			}
			return nil
		}
		if p.inputs() >= int(m.embedCap.Load()) {
			m.cleanPack()
		}
		for i, r := range p {
			run.keep(r.idx, job.Output{ID: r.id, Response: &job.Response{StatusCode: o.a.status, Body: bodies[i]}})
		}
		return nil
	case actTooLarge:
		if n := p.inputs(); n > 1 {
			m.lowerCap(n)
		}
		if len(p) > 1 {
			return m.halves(ctx, wait, p, run)
		}
	case actOOM:
		if len(p) > 1 {
			return m.halves(ctx, wait, p, run)
		}
		return fmt.Errorf("%w: the model server could not hold one embeddings item (%d inputs): %s",
			gpu.ErrOutOfMemory, len(p[0].inputs), o.a.describe(false))
	case actItem:
		if len(p) > 1 {
			return m.halves(ctx, wait, p, run)
		}
	}
	run.keep(p[0].idx, m.output(p[0].id, o))
	return nil
}

func (m *Model) halves(ctx, wait context.Context, p pack, run *run) error {
	g := newGroup(ctx, wait)
	half := len(p) / 2
	g.Go(func(sent, wait context.Context) error { return m.embed(sent, wait, p[:half], run) })
	g.Go(func(sent, wait context.Context) error { return m.embed(sent, wait, p[half:], run) })
	return g.Wait()
}

// lowerCap halves the inputs per request after a request of n was too large.
func (m *Model) lowerCap(n int) {
	for {
		cur := m.embedCap.Load()
		next := max(1, int64(n)/2)
		if next >= cur || m.embedCap.CompareAndSwap(cur, next) {
			if next < cur {
				m.log.Warn("embeddings request too large for the server: fewer inputs per request", "from", cur, "to", next)
			}
			m.capClean.Store(0)
			return
		}
	}
}

// cleanPack counts a full pack the server took; a run of them grows a
// lowered cap back one input.
func (m *Model) cleanPack() {
	if m.embedCap.Load() >= int64(m.cfg.EmbedBatch) {
		return
	}
	if m.capClean.Add(1) >= embedCapGrowRun {
		m.capClean.Store(0)
		m.embedCap.Add(1)
	}
}

// cut splits an embeddings answer into each item's body.
func (m *Model) cut(p pack, body []byte, u usage) ([]json.RawMessage, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil, false
	}
	var data []map[string]json.RawMessage
	if json.Unmarshal(top["data"], &data) != nil || len(data) != p.inputs() {
		return nil, false
	}
	byIndex := make([]map[string]json.RawMessage, len(data))
	for i, d := range data {
		idx := i
		if raw, ok := d["index"]; ok {
			n, err := strconv.Atoi(string(raw))
			if err != nil || n < 0 || n >= len(data) {
				return nil, false
			}
			idx = n
		}
		if byIndex[idx] != nil {
			return nil, false
		}
		byIndex[idx] = d
	}
	shares := m.shares(p, u.PromptTokens)
	_, hasUsage := top["usage"]
	out := make([]json.RawMessage, len(p))
	at := 0
	for i, r := range p {
		entries := make([]map[string]json.RawMessage, len(r.inputs))
		for j := range r.inputs {
			e := make(map[string]json.RawMessage, len(byIndex[at+j]))
			for k, v := range byIndex[at+j] {
				e[k] = v
			}
			e["index"] = json.RawMessage(strconv.Itoa(j))
			entries[j] = e
		}
		at += len(r.inputs)
		obj := make(map[string]json.RawMessage, len(top))
		for k, v := range top {
			obj[k] = v
		}
		obj["data"], _ = json.Marshal(entries)
		if hasUsage {
			obj["usage"], _ = json.Marshal(map[string]int64{"prompt_tokens": shares[i], "total_tokens": shares[i]})
		}
		out[i], _ = json.Marshal(obj)
	}
	return out, true
}

// shares apportions total prompt tokens to a pack's items: their exact
// counts when all are exact, else in proportion to their estimates.
func (m *Model) shares(p pack, total int64) []int64 {
	s := make([]int64, len(p))
	exact := true
	var sum int64
	for i, r := range p {
		exact = exact && r.prompt.bound == 0
		s[i] = m.counter.tokens(r.kind(), r.prompt)
		sum += s[i]
	}
	if exact && sum == total || sum == 0 {
		return s
	}
	var given int64
	for i := range s {
		if i == len(s)-1 {
			s[i] = total - given
			break
		}
		s[i] = total * s[i] / sum
		given += s[i]
	}
	return s
}
