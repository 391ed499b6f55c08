package robustness

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The crash reason is the last crash's header, even when a signal line
// follows it and an earlier run of the process crashed too.
func TestCrashReason(t *testing.T) {
	out := "started\nfatal error: old one\n--- killed ---\nstarted\nfatal error: concurrent map writes\n[signal SIGSEGV: segmentation violation]\n\ngoroutine 1 [running]:\n" + strings.Repeat("frame\n", 10)
	r := crashReason(out)
	assert.True(t, strings.HasPrefix(r, "fatal error: concurrent map writes\n[signal SIGSEGV"), r)
	assert.Equal(t, "(no Go crash header in the kept output)", crashReason("just logs\n"))
	assert.True(t, strings.HasPrefix(crashReason("x\nunexpected fault address 0x1\n"), "unexpected fault address"))
}
