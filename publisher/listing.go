package publisher

import (
	"context"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
)

// The listings of the OpenAI-compatible routes (GET /v1/files, GET
// /v1/batches): OpenAI's cursor page, over records kept as
// {prefix}{id}.json under their owner's prefix, ids that sort as the
// records were made (newTimeID).

// listPage is a page of an OpenAI list, which its SDKs' auto-pagers follow
// by has_more and the last id (after).
type listPage[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// newListPage is the page of data, whose elements' ids id gives.
func newListPage[T any](data []T, hasMore bool, id func(T) string) listPage[T] {
	pg := listPage[T]{Object: "list", Data: data, HasMore: hasMore}
	if pg.Data == nil {
		pg.Data = []T{}
	}
	if len(data) > 0 {
		first, last := id(data[0]), id(data[len(data)-1])
		pg.FirstID, pg.LastID = &first, &last
	}
	return pg
}

// listLimit reads the query's limit: def when it has none, else a whole
// number from 1 to most.
func listLimit(q url.Values, def, most int) (int, *APIError) {
	s := q.Get("limit")
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > most {
		return 0, paramErr(http.StatusBadRequest, CodeInvalidParameter, "limit", "limit must be a whole number from 1 to %d", most)
	}
	return n, nil
}

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
