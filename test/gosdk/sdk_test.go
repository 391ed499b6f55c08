//go:build gosdk

package gosdk

import (
	"testing"

	"github.com/cloudflare/cloudflare-go/v4"
	"github.com/cloudflare/cloudflare-go/v4/d1"
	"github.com/cloudflare/cloudflare-go/v4/option"
)

func TestPlaceholder(t *testing.T) {
	_ = cloudflare.NewClient(option.WithAPIToken("x"))
	_ = d1.DatabaseNewParams{}
}
