package logging

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// HCLog returns an hclog.Logger (what hashicorp/raft, raft-wal and
// raft-boltdb log through) that writes into l's handler: the same format,
// destination and attributes as the rest of the process. The logger's name
// becomes the "component" attribute ("raft", "raft.wal").
//
// level is hclog's own threshold (raft is chatty at info: the catalog runs
// it at warn by default); records that pass it still go through l's
// handler, whose level applies too.
func HCLog(l *slog.Logger, name string, level hclog.Level) hclog.Logger {
	a := &hcAdapter{base: l, name: name, level: new(atomic.Int32)}
	a.level.Store(int32(level))
	a.log = a.withName()
	return a
}

type hcAdapter struct {
	base    *slog.Logger // without the component attribute
	log     *slog.Logger // base with component=name
	name    string
	implied []any
	level   *atomic.Int32 // shared by the loggers derived with With/Named, as in hclog
}

var _ hclog.Logger = (*hcAdapter)(nil)

func (a *hcAdapter) withName() *slog.Logger {
	if a.name == "" {
		return a.base
	}
	return a.base.With("component", a.name)
}

// slogLevel maps hclog's levels onto slog's (trace is below debug).
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (a *hcAdapter) enabled(l hclog.Level) bool {
	min := hclog.Level(a.level.Load())
	if l < min || min == hclog.Off {
		return false
	}
	return a.log.Enabled(context.Background(), slogLevel(l))
}

func (a *hcAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.NoLevel || level == hclog.Off {
		level = hclog.Info
	}
	if !a.enabled(level) {
		return
	}
	// The caller's frame, as slog's own methods record it: skip Callers,
	// this function and the level method (Info, Warn, …) that called it.
	var pcs [1]uintptr
	runtime.Callers(3, pcs[:])
	r := slog.NewRecord(time.Now(), slogLevel(level), msg, pcs[0])
	r.Add(fixArgs(args)...)
	_ = a.log.Handler().Handle(context.Background(), r)
}

// fixArgs turns hclog's key/value list into slog's: hclog accepts an odd
// trailing value (logged as EXTRA_VALUE_AT_END) and hclog.Format values.
func fixArgs(args []any) []any {
	out := make([]any, 0, len(args)+1)
	for i := 0; i < len(args); i += 2 {
		if i+1 >= len(args) {
			out = append(out, "extra", args[i])
			break
		}
		k, ok := args[i].(string)
		if !ok {
			k = "key"
		}
		v := args[i+1]
		if f, ok := v.(hclog.Format); ok && len(f) > 0 {
			if s, ok := f[0].(string); ok {
				v = strings.TrimSpace(fmt.Sprintf(s, f[1:]...))
			}
		}
		out = append(out, k, v)
	}
	return out
}

func (a *hcAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hcAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hcAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hcAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hcAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hcAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hcAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hcAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hcAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hcAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hcAdapter) ImpliedArgs() []any { return a.implied }

func (a *hcAdapter) With(args ...any) hclog.Logger {
	b := *a
	b.implied = append(append([]any{}, a.implied...), args...)
	b.base = a.base.With(fixArgs(args)...)
	b.log = b.withName()
	return &b
}

func (a *hcAdapter) Name() string { return a.name }

func (a *hcAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *hcAdapter) ResetNamed(name string) hclog.Logger {
	b := *a
	b.name = name
	b.log = b.withName()
	return &b
}

func (a *hcAdapter) SetLevel(level hclog.Level) { a.level.Store(int32(level)) }

func (a *hcAdapter) GetLevel() hclog.Level { return hclog.Level(a.level.Load()) }

// StandardLogger and StandardWriter serve libraries that want a *log.Logger:
// each line becomes one record at the options' level (info by default).
func (a *hcAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hcAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	lvl := hclog.Info
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		lvl = opts.ForceLevel
	}
	return &stdWriter{a: a, level: lvl}
}

type stdWriter struct {
	a     *hcAdapter
	level hclog.Level
}

func (w *stdWriter) Write(p []byte) (int, error) {
	w.a.Log(w.level, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
