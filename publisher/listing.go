package publisher

import (
	"context"
	"path"
	"slices"
	"strings"
)

// The listings of the OpenAI-compatible routes (GET /v1/files, GET
// /v1/batches): OpenAI's cursor page, over records kept as
// {prefix}{id}.json under their owner's prefix, ids that sort as the
// records were made (newTimeID).

// listIDs lists the ids of the records under prefix, {prefix}{id}.json
// with valid(id), oldest first: one List, no record read.
func (p *Publisher) listIDs(ctx context.Context, prefix string, valid func(string) bool) ([]string, error) {
	keys, err := p.store.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, k := range keys {
		if id, ok := strings.CutSuffix(path.Base(k), ".json"); ok && valid(id) && k == prefix+id+".json" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}
