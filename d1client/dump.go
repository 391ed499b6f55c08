package d1client

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// DumpOptions are D1's dump_options.
type DumpOptions struct {
	NoData   bool     `json:"no_data,omitempty"`
	NoSchema bool     `json:"no_schema,omitempty"`
	Tables   []string `json:"tables,omitempty"`
}

// ExportStatus is the export polling answer.
type ExportStatus struct {
	Type       string   `json:"type"`
	Status     string   `json:"status"`
	AtBookmark string   `json:"at_bookmark"`
	Messages   []string `json:"messages"`
	Error      string   `json:"error,omitempty"`
	Result     *struct {
		Filename  string `json:"filename"`
		SignedURL string `json:"signed_url"`
	} `json:"result,omitempty"`
}

// ImportStatus is the import polling answer.
type ImportStatus struct {
	Type       string   `json:"type"`
	Status     string   `json:"status"`
	AtBookmark string   `json:"at_bookmark"`
	Messages   []string `json:"messages"`
	Error      string   `json:"error,omitempty"`
	Result     *struct {
		FinalBookmark string         `json:"final_bookmark"`
		NumQueries    int64          `json:"num_queries"`
		Meta          map[string]any `json:"meta"`
	} `json:"result,omitempty"`
	Progress *struct {
		Bytes      int64 `json:"bytes"`
		TotalBytes int64 `json:"total_bytes"`
		Statements int64 `json:"statements"`
	} `json:"progress,omitempty"`
}

// Hooks receive progress of long operations; nil fields are ignored.
type Hooks struct {
	Polling  func(status string) // each poll answer while waiting
	Transfer func(n int64)       // bytes downloaded/uploaded so far
	Total    func(n int64)       // total bytes when known
}

func (c *Client) pollWait(ctx context.Context) error {
	d := c.PollInterval
	if d <= 0 {
		d = 500 * time.Millisecond
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// StartExport runs D1's export protocol up to a signed URL: it polls with
// current_bookmark until the status is complete (or error).
func (c *Client) StartExport(ctx context.Context, uuid string, o DumpOptions, h Hooks) (ExportStatus, error) {
	body := map[string]any{"output_format": "polling"}
	if o.NoData || o.NoSchema || len(o.Tables) > 0 {
		body["dump_options"] = o
	}
	for {
		var st ExportStatus
		if _, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "export"), body, &st, nil); err != nil {
			return st, err
		}
		if h.Polling != nil {
			h.Polling(st.Status)
		}
		switch st.Status {
		case "complete":
			if st.Result == nil || st.Result.SignedURL == "" {
				return st, fmt.Errorf("export complete without a download URL")
			}
			return st, nil
		case "error":
			return st, &APIError{Status: http.StatusBadRequest, Code: 7500, Message: "export failed: " + st.Error}
		}
		body["current_bookmark"] = st.AtBookmark
		if err := c.pollWait(ctx); err != nil {
			return st, err
		}
	}
}

// Export runs the export protocol and writes the dump to w. It returns the
// bytes written; a transfer cut short is an error, never a short dump.
func (c *Client) Export(ctx context.Context, uuid string, o DumpOptions, w io.Writer, h Hooks) (int64, error) {
	st, err := c.StartExport(ctx, uuid, o, h)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.Result.SignedURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return 0, &APIError{Status: http.StatusServiceUnavailable, Code: 7503, Message: "download: " + shortNetErr(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := decode(resp, nil, nil)
		return 0, err
	}
	if h.Total != nil && resp.ContentLength > 0 {
		h.Total(resp.ContentLength)
	}
	n, err := io.Copy(w, &countingReader{r: resp.Body, f: h.Transfer})
	if err != nil {
		return n, fmt.Errorf("download interrupted after %d bytes: %w", n, err)
	}
	return n, nil
}

type countingReader struct {
	r io.Reader
	n int64
	f func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.f != nil && n > 0 {
		c.f(c.n)
	}
	return n, err
}

// FileMD5 returns the MD5 hex digest of a file (D1's import etag).
func FileMD5(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := md5.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Import runs D1's import protocol with the SQL file at path: init (etag =
// MD5), PUT the file to the upload URL (streamed from disk), ingest, then
// poll until complete or error. hooks.Polling receives every status;
// progress(st) receives every poll answer (for statement counts).
func (c *Client) Import(ctx context.Context, uuid, path string, h Hooks, progress func(ImportStatus)) (ImportStatus, error) {
	etag, size, err := FileMD5(path)
	if err != nil {
		return ImportStatus{}, err
	}
	if h.Total != nil {
		h.Total(size)
	}
	var ini struct {
		UploadURL string `json:"upload_url"`
		Filename  string `json:"filename"`
	}
	if _, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "import"), map[string]string{"action": "init", "etag": etag}, &ini, nil); err != nil {
		return ImportStatus{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return ImportStatus{}, err
	}
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, ini.UploadURL, &countingReader{r: f, f: h.Transfer})
	if err != nil {
		return ImportStatus{}, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return ImportStatus{}, &APIError{Status: http.StatusServiceUnavailable, Code: 7503, Message: "upload: " + shortNetErr(err)}
	}
	_, err = decode(resp, nil, nil)
	resp.Body.Close()
	if err != nil {
		return ImportStatus{}, err
	}
	var st ImportStatus
	if _, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "import"),
		map[string]string{"action": "ingest", "etag": etag, "filename": ini.Filename}, &st, nil); err != nil {
		return st, err
	}
	for {
		if h.Polling != nil {
			h.Polling(st.Status)
		}
		if progress != nil {
			progress(st)
		}
		switch st.Status {
		case "complete":
			return st, nil
		case "error":
			return st, &APIError{Status: http.StatusBadRequest, Code: 7500, Message: "import failed: " + st.Error}
		}
		if err := c.pollWait(ctx); err != nil {
			return st, err
		}
		bm := st.AtBookmark
		st = ImportStatus{}
		if _, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "import"),
			map[string]string{"action": "poll", "current_bookmark": bm}, &st, nil); err != nil {
			return st, err
		}
	}
}
