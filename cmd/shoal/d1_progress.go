package main

import (
	"fmt"
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
	label string
	bar   *progressbar.ProgressBar
	total int64
}

func (e *d1Env) newProgress(label string) *progress {
	return &progress{on: e.interactive(), e: e, label: label}
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
		progressbar.OptionShowBytes(max != -1),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionClearOnFinish(),
	)
}

func (p *progress) hooks() d1client.Hooks {
	return d1client.Hooks{
		Polling: func(status string) {
			if p.on && status != "complete" {
				p.ensure(-1, p.label+": "+status)
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
