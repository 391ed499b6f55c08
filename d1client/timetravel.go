package d1client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// Restore is POST …/time_travel/restore's result.
type Restore struct {
	Bookmark         string `json:"bookmark"`
	PreviousBookmark string `json:"previous_bookmark"`
	Message          string `json:"message"`
}

// Bookmark returns the database's current bookmark, or with timestamp (RFC
// 3339 or Unix seconds) the one for the database as of then.
func (c *Client) Bookmark(ctx context.Context, uuid, timestamp string, raw *json.RawMessage) (string, error) {
	u := c.dbURL(uuid, "time_travel", "bookmark")
	if timestamp != "" {
		u += "?" + url.Values{"timestamp": {timestamp}}.Encode()
	}
	var out struct {
		Bookmark string `json:"bookmark"`
	}
	_, err := c.do(ctx, http.MethodGet, u, nil, &out, raw)
	return out.Bookmark, err
}

// RestoreTo restores the database to bookmark or, when bookmark is empty,
// to timestamp. The result's PreviousBookmark undoes it.
func (c *Client) RestoreTo(ctx context.Context, uuid, bookmark, timestamp string, raw *json.RawMessage) (Restore, error) {
	q := url.Values{}
	if bookmark != "" {
		q.Set("bookmark", bookmark)
	} else {
		q.Set("timestamp", timestamp)
	}
	var out Restore
	_, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "time_travel", "restore")+"?"+q.Encode(), nil, &out, raw)
	return out, err
}

// ForkOptions choose the fork's point (at most one of Bookmark and
// Timestamp; neither: the source's latest commit) and its placement.
type ForkOptions struct {
	Bookmark            string
	Timestamp           string // RFC 3339 or Unix seconds
	PrimaryLocationHint string
}

// Fork is POST …/fork's result: the new database and its origin.
type Fork struct {
	Database
	ForkedFrom struct {
		UUID     string `json:"uuid"`
		Bookmark string `json:"bookmark"`
	} `json:"forked_from"`
}

// Fork creates database name (same account) whose content is database
// uuid as of o's point (a Shoal extension of D1's API).
func (c *Client) Fork(ctx context.Context, uuid, name string, o ForkOptions, raw *json.RawMessage) (Fork, error) {
	body := map[string]string{"name": name}
	if o.Bookmark != "" {
		body["bookmark"] = o.Bookmark
	}
	if o.Timestamp != "" {
		body["timestamp"] = o.Timestamp
	}
	if o.PrimaryLocationHint != "" {
		body["primary_location_hint"] = o.PrimaryLocationHint
	}
	var out Fork
	_, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "fork"), body, &out, raw)
	return out, err
}
