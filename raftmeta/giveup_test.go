package raftmeta

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A request that gave up names a cause, never "<nil>": its last node's
// error, else its context's, else that no node answered.
func TestGiveUpCauseNeverNil(t *testing.T) {
	boom := errors.New("boom")
	assert.Equal(t, boom, giveUpCause(context.Background(), boom))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, giveUpCause(ctx, nil), context.Canceled)
	assert.EqualError(t, giveUpCause(context.Background(), nil), "no node answered")
	assert.NotContains(t, writeGaveUp(context.Background(), nil).Error(), "<nil>")
}
