package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// client is shared by every caller in the process so that connections to
// the edges and hosts are reused (64 idle ones per host: the benches' client
// counts).
var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// Client is the HTTP client Call, Try and GetJSON use (30 s timeout, 64
// idle connections per host), for tests that send their own requests. Safe
// for concurrent use; callers must not modify it.
func Client() *http.Client { return client }

// Answer is one response of the v4 API: the envelope decoded, with the
// HTTP status and the raw body.
type Answer struct {
	Status  int             `json:"-"`
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
	Raw []byte `json:"-"`
}

// Code is the first error's code, 0 when there is none.
func (a Answer) Code() int {
	if len(a.Errors) == 0 {
		return 0
	}
	return a.Errors[0].Code
}

// Call sends body (JSON-encoded; nil for none) to url with auth as the
// Authorization header (none when empty), and fails t if there is no v4
// envelope to decode. Any HTTP status is an answer: check Status.
func Call(t testing.TB, method, url, auth string, body any) Answer {
	a, err := Try(method, url, auth, body)
	require.NoError(t, err)
	return a
}

// Try is Call for goroutines other than the test's: it returns what went
// wrong (transport error, or a body that is not a v4 envelope) instead of
// failing the test.
func Try(method, url, auth string, body any) (Answer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return Answer{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return Answer{}, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, err
	}
	var a Answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return Answer{}, fmt.Errorf("%s %s: status %d, not a v4 envelope: %w: %s", method, url, resp.StatusCode, err, raw)
	}
	a.Status, a.Raw = resp.StatusCode, raw
	return a, nil
}

// AnswerText is a Try result for a message: the error, or the status and
// the body's last 300 bytes.
func AnswerText(a Answer, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d %s", a.Status, Tail(string(a.Raw), 300))
}

// GetJSON decodes the JSON body of a GET of url into out; a status other
// than 200 is an error. Safe from any goroutine.
func GetJSON(url string, out any) error { return GetJSONWith(client, url, out) }

// GetJSONWith is GetJSON through hc.
func GetJSONWith(hc *http.Client, url string, out any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
