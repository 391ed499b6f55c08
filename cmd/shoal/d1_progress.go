package main

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/shoaldb/shoal/d1client"
)

// progress draws a spinner while polling and a byte bar while transferring,
// on stderr, and only when stdout and stderr are both terminals: piped or
// redirected output never carries progress.
type progress struct {
	on    bool
	e     *d1Env
	label string // shown while transferring
	wait  string // shown while polling
	bar   *progressbar.ProgressBar
	total int64
}

func (e *d1Env) newProgress(label, wait string) *progress {
	return &progress{on: e.interactive(), e: e, label: label, wait: wait}
}

func (p *progress) ensure(max int64, desc string) {
	if !p.on {
		return
	}
	if p.bar != nil && p.total == max {
		p.bar.Describe(desc)
		return
	}
	if p.bar != nil {
		_ = p.bar.Finish()
	}
	p.total = max
	p.bar = progressbar.NewOptions64(max,
		progressbar.OptionSetWriter(p.e.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionClearOnFinish(),
	)
	_ = p.bar.RenderBlank() // show it now, not at the first throttled update
}

func (p *progress) hooks() d1client.Hooks {
	return d1client.Hooks{
		Polling: func(status string) {
			if p.on && (status == "active" || status == "") {
				p.ensure(-1, p.wait)
				_ = p.bar.Add(1)
			}
		},
		Total: func(n int64) { p.ensure(n, p.label) },
		Transfer: func(n int64) {
			if p.on {
				if p.bar == nil {
					p.ensure(-1, p.label)
				}
				_ = p.bar.Set64(n)
			}
		},
	}
}

// importStatus shows the server's progress (bytes and statements) while an
// import is being ingested.
func (p *progress) importStatus(st d1client.ImportStatus) {
	if !p.on || st.Progress == nil || st.Status != "active" {
		return
	}
	p.ensure(st.Progress.TotalBytes, "importing")
	p.bar.Describe(fmt.Sprintf("importing (%d statements)", st.Progress.Statements))
	_ = p.bar.Set64(st.Progress.Bytes)
}

func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
}

// stmtCounter counts statements (";\n" line ends) in a dump as it is
// written, for the export progress line.
type stmtCounter struct {
	w    io.Writer
	p    *progress
	n    int64
	last byte
}

func (c *stmtCounter) Write(b []byte) (int, error) {
	for i, x := range b {
		prev := c.last
		if i > 0 {
			prev = b[i-1]
		}
		if x == '\n' && prev == ';' {
			c.n++
		}
	}
	if len(b) > 0 {
		c.last = b[len(b)-1]
	}
	if c.p.on && c.p.bar != nil {
		c.p.bar.Describe(fmt.Sprintf("%s (%d statements)", c.p.label, c.n))
	}
	return c.w.Write(b)
}
