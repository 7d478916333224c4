package api

import (
	"context"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/vramq/vramq/internal/payload"
)

// The listings of the OpenAI-compatible routes (GET /v1/files, GET
// /v1/batches): OpenAI's cursor page, over records kept as
// {prefix}{id}.json under their owner's prefix, ids that sort as the
// records were made (NewTimeID).

// ListPage is a page of an OpenAI list, which its SDKs' auto-pagers follow
// by has_more and the last id (after).
type ListPage[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// NewListPage is the page of data, whose elements' ids id gives.
func NewListPage[T any](data []T, hasMore bool, id func(T) string) ListPage[T] {
	pg := ListPage[T]{Object: "list", Data: data, HasMore: hasMore}
	if pg.Data == nil {
		pg.Data = []T{}
	}
	if len(data) > 0 {
		first, last := id(data[0]), id(data[len(data)-1])
		pg.FirstID, pg.LastID = &first, &last
	}
	return pg
}

// ListLimit reads the query's limit: def when it has none, else a whole
// number from 1 to most.
func ListLimit(q url.Values, def, most int) (int, *Error) {
	s := q.Get("limit")
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > most {
		return 0, ParamErr(http.StatusBadRequest, CodeInvalidParameter, "limit", "limit must be a whole number from 1 to %d", most)
	}
	return n, nil
}

// ListIDs lists the ids of the records under prefix, {prefix}{id}.json
// with valid(id), oldest first: one List, no record read.
func ListIDs(ctx context.Context, store *payload.Store, prefix string, valid func(string) bool) ([]string, error) {
	keys, err := store.List(ctx, prefix)
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
