package edge

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Every database route answers 405 to a method it does not serve — mux's
// method mismatch is sensitive to the order routes are registered in (the
// time-travel routes once turned POST …/insights into a 404).
func TestDatabaseRoutesWrongMethodIs405(t *testing.T) {
	e := newEnv(t)
	id := "01a23504-33ae-784b-b692-1bbc0e16e225"
	for _, c := range []struct{ method, suffix string }{
		{http.MethodPost, "/" + id + "/insights"},
		{http.MethodPost, "/" + id + "/time_travel/bookmark"},
		{http.MethodGet, "/" + id + "/time_travel/restore"},
		{http.MethodGet, "/" + id + "/export"},
		{http.MethodGet, "/" + id + "/query"},
	} {
		a := e.call(c.method, dbPath(acctA)+c.suffix, tokA, nil)
		assert.Equal(t, http.StatusMethodNotAllowed, a.Status, "%s %s: %s", c.method, c.suffix, a.Raw)
	}
}
