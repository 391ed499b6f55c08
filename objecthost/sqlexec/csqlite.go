package sqlexec

// The SQLite library itself is the one mattn/go-sqlite3 compiles and links
// (with the build tags and CGO_CFLAGS from build.env). We call its C API
// directly: the database/sql layer cannot split a multi-statement string with
// prepare's tail, read scan statistics, or tell read-only statements apart,
// and owning the sqlite3_stmt lets us cache statements per connection.
// mattn's sqlite3-binding.h is not exported, so the few prototypes and
// constants we use are declared in shim.h; they are SQLite's stable C API.
// shim.c holds the C callbacks (authorizer, preupdate hook, progress
// handler) and batched accessors that keep cgo calls per row to one.

/*
#include "shim.h"
*/
import "C"

import (
	// Links the bundled SQLite (compiled with build.env's tags and flags)
	// whose C API shim.c and this package call directly.
	_ "github.com/mattn/go-sqlite3"
)
