package sqlexec

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

// The fallback count of rows written, used only when D1's counters are
// unavailable (d1Counts: the linked SQLite is not the one shim.c's layout
// mirrors). Row changes are recorded by the preupdate hook (shim.c) while a
// statement runs on the writer; after the statement, rowsWritten turns them
// into an approximation of D1's rows_written: each row change counts 1 for the table row plus 1 for every
// index entry it touches. INSERT and DELETE touch every index of the table;
// an UPDATE touches only the indexes whose key columns changed (expression
// indexes count as touched, a rowid change touches all of them).

const (
	opDelete = 9
	opInsert = 18
	opUpdate = 23
)

type indexKey struct {
	cids []int // table column numbers; -1 rowid, -2 expression
}

type tableIndexes struct {
	indexes []indexKey
}

// touched counts the indexes an UPDATE with the given changed-column mask
// writes.
func (t *tableIndexes) touched(all bool, m0, m1 uint64) int64 {
	if all {
		return int64(len(t.indexes))
	}
	var n int64
	for _, ix := range t.indexes {
		for _, cid := range ix.cids {
			changed := false
			switch {
			case cid == -2:
				changed = true
			case cid >= 0 && cid < 64:
				changed = m0&(1<<uint(cid)) != 0
			case cid >= 64 && cid < 128:
				changed = m1&(1<<uint(cid-64)) != 0
			case cid >= 128:
				changed = true
			}
			if changed {
				n++
				break
			}
		}
	}
	return n
}

func (c *conn) rowsWritten() (int64, error) {
	if c.sc.oom != 0 {
		return 0, fmt.Errorf("sqlexec: out of memory recording row changes")
	}
	nrec := int(c.sc.nrec)
	if nrec == 0 {
		return 0, nil
	}
	// Copy the records out first: loading index info runs SQL, which must not
	// happen while we hold pointers into the C array (it is not touched by
	// reads, but keep the rule simple).
	type rec struct {
		tab    string
		op     int
		all    bool
		m0, m1 uint64
		n      int64
	}
	recs := make([]rec, nrec)
	for i, r := range unsafe.Slice(c.sc.recs, nrec) {
		recs[i] = rec{tab: C.GoString(r.tab), op: int(r.op), all: r.allcols != 0, m0: uint64(r.m[0]), m1: uint64(r.m[1]), n: int64(r.n)}
	}
	C.shoal_clear_recs(c.sc)
	if gen := c.schemaGen.Load(); c.indexInfo == nil || c.infoGen != gen {
		c.indexInfo, c.infoGen = make(map[string]*tableIndexes), gen
	}
	var total int64
	for _, r := range recs {
		if strings.HasPrefix(strings.ToLower(r.tab), "sqlite_") {
			continue // SQLite's own bookkeeping (schema, sequence, stat)
		}
		ti, err := c.tableIndexes(r.tab)
		if err != nil {
			return 0, err
		}
		per := int64(1)
		switch r.op {
		case opInsert, opDelete:
			per += int64(len(ti.indexes))
		case opUpdate:
			per += ti.touched(r.all, r.m0, r.m1)
		}
		total += per * r.n
	}
	return total, nil
}

// tableIndexes loads (and caches until the next schema change) the key
// columns of the table's indexes. For a WITHOUT ROWID table the primary-key
// index is the table itself and is not counted again.
func (c *conn) tableIndexes(tab string) (*tableIndexes, error) {
	if ti, ok := c.indexInfo[tab]; ok {
		return ti, nil
	}
	ti := &tableIndexes{}
	withoutRowid, err := c.queryIntArg(`SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?1`, tab)
	if err != nil {
		return nil, err
	}
	names, err := c.queryStrings(`SELECT name, origin FROM pragma_index_list(?1)`, tab)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(names); i += 2 {
		name, origin := names[i], names[i+1]
		if withoutRowid == 1 && origin == "pk" {
			continue
		}
		cidStrs, err := c.queryStrings(`SELECT cid FROM pragma_index_xinfo(?1) WHERE key = 1`, name)
		if err != nil {
			return nil, err
		}
		ix := indexKey{}
		for _, s := range cidStrs {
			var cid int
			fmt.Sscan(s, &cid)
			ix.cids = append(ix.cids, cid)
		}
		ti.indexes = append(ti.indexes, ix)
	}
	c.indexInfo[tab] = ti
	return ti, nil
}

func (c *conn) queryIntArg(sql, arg string) (int64, error) {
	vals, err := c.queryStrings(sql, arg)
	if err != nil || len(vals) == 0 {
		return 0, err
	}
	var v int64
	fmt.Sscan(vals[0], &v)
	return v, nil
}

// queryStrings runs an internal statement with one text argument and
// returns every column of every row as text, flattened.
func (c *conn) queryStrings(sql, arg string) ([]string, error) {
	s, err := c.internalStmt(sql)
	if err != nil {
		return nil, err
	}
	c.sc.user = 0
	C.shoal_bind_text(s, 1, (*C.char)(unsafe.Pointer(unsafe.StringData(arg))), C.int(len(arg)))
	var out []string
	ncol := int(C.sqlite3_column_count(s))
	rc := C.sqlite3_step(s)
	for rc == rcRow {
		for i := 0; i < ncol; i++ {
			p := C.sqlite3_column_text(s, C.int(i))
			n := C.sqlite3_column_bytes(s, C.int(i))
			out = append(out, C.GoStringN((*C.char)(unsafe.Pointer(p)), n))
		}
		rc = C.sqlite3_step(s)
	}
	C.sqlite3_reset(s)
	if rc != rcDone {
		return nil, c.errorFor(rc, -1)
	}
	return out, nil
}
