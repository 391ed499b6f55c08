package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shoaldb/shoal/pipeline/event"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Headers of the object hosts' internal API (see docs/objecthost-api.md).
const (
	HeaderDatabase   = "X-Shoal-Database"
	HeaderAccount    = "X-Shoal-Account"
	HeaderGeneration = "X-Shoal-Generation"
	HeaderRequestID  = "X-Request-ID"
	// headerRequestIDCanonical is HeaderRequestID in canonical form, for setting and
	// reading it on the query path without canonicalising (one allocation
	// each) on every request.
	headerRequestIDCanonical = "X-Request-Id"
	// HeaderNumbers ("exact" or "js": integers beyond ±2^53 as D1 renders
	// them) is passed from the client to the object host, which checks it.
	HeaderNumbers = "Shoal-Numbers"
	// HeaderReadOnly "1": the query runs read-only (a D1 Read token).
	HeaderReadOnly = "X-Shoal-Read-Only"
)

// ObjectInfo, InitRequest and InitOptions are the object host's API types,
// defined once in pipeline/event for both sides.
type (
	ObjectInfo    = event.ObjectInfo
	InitRequest   = event.InitRequest
	RestoreSource = event.RestoreSource
	InitOptions   = event.InitOptions
)

// HostError is a refusal by an object host: its HTTP status and v4 error.
type HostError struct {
	Status  int
	Code    int
	Message string
}

func (e *HostError) Error() string {
	return fmt.Sprintf("object host: %d %d %s", e.Status, e.Code, e.Message)
}

// retryable reports whether a failed host call may succeed if retried (with
// new IDs, for creation): transport errors, overload and 5xx.
func retryable(err error) bool {
	var he *HostError
	if errors.As(err, &he) {
		return he.Status >= 500 || he.Status == http.StatusTooManyRequests || he.Status == http.StatusConflict
	}
	return err != nil
}

// neverSent reports whether err proves the request did not reach the host, so
// resending it cannot execute it twice: the dial was refused.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &op) && op.Op == "dial")
}

// HostClient calls object hosts over pooled keep-alive HTTP. Safe for
// concurrent use.
type HostClient struct {
	http    *http.Client // control calls (init, confirm, delete, info, dumps)
	raw     *hostConns   // forward's round trips over HTTP (see hostConns)
	frames  *hostFrames  // forward's round trips over frames (nil: HTTP only)
	timeout time.Duration
	scheme  string // "https" with TLS
	// Forwards by transport (the edge's /metrics).
	sentFrames, sentHTTP atomic.Int64
	// Batched lifecycle calls by transport (the edge's /metrics).
	batchFrames, batchHTTP atomic.Int64
}

// NewHostClient returns a client with a connection pool sized for an edge
// talking to a modest number of hosts. A tls Loader, when given and not
// nil, authenticates to the hosts with the caller's cluster certificate and
// accepts only servers holding the host role (mutual TLS, internal/pki).
func NewHostClient(timeout time.Duration, tls ...*pki.Loader) *HostClient {
	var tl *pki.Loader
	if len(tls) > 0 {
		tl = tls[0]
	}
	if timeout <= 0 {
		timeout = 35 * time.Second // D1's 30 s query limit plus slack
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	raw := newHostConns(256)
	if tl != nil {
		raw.tls = tl.ClientFor(pki.RoleHost)
	}
	return &HostClient{http: &http.Client{Transport: tl.Transport(tr, pki.RoleHost), Timeout: timeout},
		raw: raw, frames: newHostFrames(raw), timeout: timeout, scheme: tl.Scheme()}
}

// Host transports (Options.HostTransport).
const (
	// TransportFrames forwards queries over multiplexed frame connections
	// (internal/frame), falling back to HTTP for hosts that do not speak
	// them. The default.
	TransportFrames = "frames"
	// TransportHTTP forwards every query as its own HTTP/1.1 exchange.
	TransportHTTP = "http"
)

// UseTransport chooses how queries are forwarded: TransportFrames (or "")
// or TransportHTTP. Call it before the client is used.
func (c *HostClient) UseTransport(t string) error {
	switch t {
	case "", TransportFrames:
		if c.frames == nil {
			c.frames = newHostFrames(c.raw)
		}
	case TransportHTTP:
		if c.frames != nil {
			c.frames.close()
			c.frames = nil
		}
	default:
		return fmt.Errorf("host transport %q: want %s or %s", t, TransportFrames, TransportHTTP)
	}
	return nil
}

// URL is the URL of path on the host at addr.
func (c *HostClient) URL(addr, path string) string { return c.scheme + "://" + addr + path }

// Close drops idle connections.
func (c *HostClient) Close() {
	c.http.CloseIdleConnections()
	if c.frames != nil {
		c.frames.close()
	}
	c.raw.close()
}

func (c *HostClient) call(ctx context.Context, addr, method, path string, rt *Route, body any, out any) error {
	return c.callOnce(ctx, addr, method, path, rt, body, out, false)
}

// againAfter are the pauses before callAgain's further attempts.
var againAfter = []time.Duration{100 * time.Millisecond, 400 * time.Millisecond, 1600 * time.Millisecond}

// callAgain is call for a request whose repetition has the effect of one
// (a delete or a confirm names the routing generation; the host applies it
// once and answers a repeat the same). A host that is restarting — the
// pooled connection to it dead, its port not listening yet, a 503 while it
// loads — gets the request again after each pause of againAfter, within
// ctx; an answer other than 503 is final. The request also carries an
// empty Idempotency-Key so net/http itself resends it on a fresh
// connection when a reused keep-alive one fails before any answer. Without
// this the edge's delete notice to a host restarted a few seconds before
// was lost, and the host learned the delete from its next heartbeat
// (robustness suite: ~2 s instead of ~1 ms, docs/reliability.md).
func (c *HostClient) callAgain(ctx context.Context, addr, method, path string, rt *Route, body any, out any) error {
	err := c.callOnce(ctx, addr, method, path, rt, body, out, true)
	for _, wait := range againAfter {
		var he *HostError
		if err == nil || (errors.As(err, &he) && he.Status != http.StatusServiceUnavailable) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		err = c.callOnce(ctx, addr, method, path, rt, body, out, true)
	}
	return err
}

func (c *HostClient) callOnce(ctx context.Context, addr, method, path string, rt *Route, body any, out any, idempotent bool) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL(addr, path), rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if idempotent {
		req.Header["Idempotency-Key"] = nil // net/http: safe to resend; not sent
	}
	if rt != nil {
		setRouteHeaders(req.Header, *rt)
	}
	if id := requestIDFrom(ctx); id != "" {
		req.Header.Set(HeaderRequestID, id)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeEnvelope(resp, out)
}

func setRouteHeaders(h http.Header, rt Route) {
	h.Set(HeaderDatabase, rt.DatabaseUUID)
	h.Set(HeaderAccount, rt.AccountID)
	if rt.Generation != 0 {
		h.Set(HeaderGeneration, strconv.FormatInt(rt.Generation, 10))
	}
}

// decodeEnvelope reads a v4 envelope; on success its result goes into out.
func decodeEnvelope(resp *http.Response, out any) error {
	var env struct {
		Result  json.RawMessage `json:"result"`
		Success bool            `json:"success"`
		Errors  []v4.Error      `json:"errors"`
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &env); err != nil || (!env.Success && resp.StatusCode < 300) {
		return &HostError{Status: resp.StatusCode, Code: v4.CodeInternal, Message: "malformed object host answer"}
	}
	if resp.StatusCode >= 300 || !env.Success {
		he := &HostError{Status: resp.StatusCode, Code: v4.CodeInternal, Message: http.StatusText(resp.StatusCode)}
		if len(env.Errors) > 0 {
			he.Code, he.Message = env.Errors[0].Code, env.Errors[0].Message
		}
		return he
	}
	if out != nil {
		return json.Unmarshal(env.Result, out)
	}
	return nil
}

// Init persists a new object's metadata on its host (create step 4).
func (c *HostClient) Init(ctx context.Context, addr, objectID string, in InitRequest) (ObjectInfo, error) {
	var info ObjectInfo
	rt := Route{DatabaseUUID: in.DatabaseUUID, AccountID: in.AccountID}
	err := c.call(ctx, addr, http.MethodPost, "/v1/objects/"+objectID+"/init", &rt, in, &info)
	return info, err
}

// Confirm tells the object its database exists (create step 7, best effort).
func (c *HostClient) Confirm(ctx context.Context, rt Route) error {
	return c.callAgain(ctx, rt.HostAddress, http.MethodPost, "/v1/objects/"+rt.ObjectID+"/confirm", &rt,
		map[string]int64{"routing_generation": rt.Generation}, nil)
}

// Delete tells the object its database is deleted (best effort; heartbeats
// are the backstop).
func (c *HostClient) Delete(ctx context.Context, rt Route) error {
	return c.callAgain(ctx, rt.HostAddress, http.MethodPost, "/v1/objects/"+rt.ObjectID+"/delete", &rt,
		map[string]int64{"routing_generation": rt.Generation}, nil)
}

// Info returns the object's live metadata (size, tables).
func (c *HostClient) Info(ctx context.Context, rt Route) (ObjectInfo, error) {
	var info ObjectInfo
	err := c.call(ctx, rt.HostAddress, http.MethodGet, "/v1/objects/"+rt.ObjectID, &rt, nil, &info)
	return info, err
}

// forward sends a query body to the host and returns the response; the caller
// closes its body. A dial that was refused (the request never left) is retried
// up to twice after a short pause; nothing else is retried here, so a write
// can never execute twice.
func (c *HostClient) forward(ctx context.Context, url string, hdr http.Header, body []byte) (*http.Response, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			}
		}
		resp, err := c.roundTrip(ctx, url, hdr, body)
		if err == nil {
			return resp, nil
		}
		lastErr = err
		if !neverSent(err) {
			return nil, err
		}
	}
	return nil, lastErr
}

// roundTrip is one forward attempt: on a frame connection to the host
// (hostFrames), or, for a host that does not speak frames, on the edge's
// own HTTP/1.1 connections (hostConns), where the whole exchange runs on
// the caller's goroutine.
func (c *HostClient) roundTrip(ctx context.Context, url string, hdr http.Header, body []byte) (*http.Response, error) {
	hdr.Set("Content-Type", "application/json")
	if c.frames != nil {
		addr, path, err := splitHostURL(url)
		if err != nil {
			return nil, err
		}
		if resp, ok, err := c.frames.roundTrip(ctx, addr, path, hdr, body, c.timeout, false); ok {
			c.sentFrames.Add(1)
			return resp, err
		}
	}
	c.sentHTTP.Add(1)
	return c.raw.roundTrip(ctx, url, hdr, body, c.timeout)
}

// errHostBatchUnsupported: the host runs a build without /v1/batch/*.
var errHostBatchUnsupported = errors.New("object host does not take batched lifecycle calls")

// batchCall posts a batched lifecycle request and returns its items (one
// per item sent, in order). A request-level 404 is a host without the
// route (the route itself never answers 404): errHostBatchUnsupported.
//
// The request goes on the host's frame connection when the host serves
// lifecycle calls there (hostFrames; the same JSON body and answer as
// over HTTP), else as an HTTP request of its own: a host of an earlier
// version, or --host-transport http. A frame connection lost with the
// batch on it fails the batch like a lost HTTP answer (each item's
// outcome unknown); it is never resent here.
func (c *HostClient) batchCall(ctx context.Context, addr, path string, body any, n int) ([]event.BatchItemAnswer, error) {
	var out event.BatchAnswer
	b, err := json.Marshal(body) // once, for either transport
	if err != nil {
		return nil, err
	}
	if ok, ferr := c.batchOverFrames(ctx, addr, path, b, &out); ok {
		err = ferr
	} else {
		c.batchHTTP.Add(1)
		err = c.call(ctx, addr, http.MethodPost, path, nil, json.RawMessage(b), &out)
	}
	var he *HostError
	if errors.As(err, &he) && he.Status == http.StatusNotFound {
		return nil, errHostBatchUnsupported
	}
	if err != nil {
		return nil, err
	}
	if len(out.Items) != n {
		return nil, &HostError{Status: http.StatusBadGateway, Code: v4.CodeInternal,
			Message: fmt.Sprintf("object host answered %d items for %d", len(out.Items), n)}
	}
	return out.Items, nil
}

// batchOverFrames sends a batched lifecycle call on the host's frame
// connection and decodes its answer into out. ok false: the host is not
// sent lifecycle calls on frames (nothing was sent; use HTTP).
func (c *HostClient) batchOverFrames(ctx context.Context, addr, path string, b []byte, out any) (ok bool, err error) {
	if c.frames == nil {
		return false, nil
	}
	hdr := http.Header{"Content-Type": {"application/json"}}
	if id := requestIDFrom(ctx); id != "" {
		hdr[headerRequestIDCanonical] = []string{id}
	}
	resp, ok, err := c.frames.roundTrip(ctx, addr, path, hdr, b, c.timeout, true)
	if !ok {
		return false, nil
	}
	c.batchFrames.Add(1)
	if err != nil {
		return true, err
	}
	defer resp.Body.Close()
	return true, decodeEnvelope(resp, out)
}

// itemErr is a batch item's outcome as the single call would have
// returned it (an empty item is success).
func itemErr(it event.BatchItemAnswer) error {
	if it.Error != nil {
		return &HostError{Status: it.Error.Status, Code: it.Error.Code, Message: it.Error.Message}
	}
	return nil
}

// InitBatch is Init for several objects of one host in one request; the
// i-th error is items[i]'s. A whole-request failure is returned alone (a
// transport error leaves each init's outcome unknown, as for Init);
// errHostBatchUnsupported: send them one by one.
func (c *HostClient) InitBatch(ctx context.Context, addr string, items []event.InitBatchItem) ([]error, error) {
	its, err := c.batchCall(ctx, addr, "/v1/batch/init", event.InitBatchRequest{Inits: items}, len(items))
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(items))
	for i, it := range its {
		errs[i] = itemErr(it)
	}
	return errs, nil
}

// ConfirmBatch is Confirm for several objects of one host in one request.
func (c *HostClient) ConfirmBatch(ctx context.Context, addr string, rts []Route) ([]error, error) {
	req := event.ConfirmBatchRequest{Confirms: make([]event.ConfirmBatchItem, len(rts))}
	for i, rt := range rts {
		req.Confirms[i] = event.ConfirmBatchItem{ObjectID: rt.ObjectID, DatabaseUUID: rt.DatabaseUUID,
			AccountID: rt.AccountID, RoutingGeneration: rt.Generation}
	}
	its, err := c.batchCall(ctx, addr, "/v1/batch/confirm", req, len(rts))
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(rts))
	for i, it := range its {
		errs[i] = itemErr(it)
	}
	return errs, nil
}
