// Package logging builds the one log format every Shoal process writes:
// log/slog records, as text or JSON lines, on stderr. hashicorp/raft and its
// log stores log through hclog; HCLog adapts hclog to the same slog handler,
// so an operator parses one format whatever component wrote the line.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Formats accepted by New.
const (
	FormatText = "text"
	FormatJSON = "json"
)

// New returns a logger writing format ("text" or "json") to w at level
// ("debug", "info", "warn" or "error", any case).
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case FormatText, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: unknown format %q (want %q or %q)", format, FormatText, FormatJSON)
}

// ParseLevel parses a level name as slog does ("debug", "info", "warn",
// "error", optionally "+N"/"-N").
func ParseLevel(level string) (slog.Level, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return 0, fmt.Errorf("--log-level: %w", err)
	}
	return lvl, nil
}
