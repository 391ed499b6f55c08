// Package model holds the sequential specifications porcupine checks the
// robustness suite's histories against. Each model partitions its history by
// database: one database's operations never constrain another's, and small
// partitions keep the check fast.
package model

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// RegisterOp is what an operation does to a database's register.
type RegisterOp int

const (
	// RegWrite sets the register to Value.
	RegWrite RegisterOp = iota
	// RegRead returns the register (RegisterOutput.Value).
	RegRead
	// RegBookmark takes the database's current time-travel bookmark
	// (RegisterOutput.Bookmark): a name for the register's value now.
	RegBookmark
	// RegRestore restores the database to the bookmark Bookmark (time
	// travel): the register becomes the value it had when that bookmark
	// was taken. Its answer names two more points (RegisterOutput.Prev,
	// the state just before the restore, and After, the state it made).
	RegRestore
)

// RegisterInput is one operation on a database's register (table reg, row
// k = 0). Bookmarks are numbered by the caller (validate.RegisterOperations):
// the same bookmark string, the same number, from 1.
type RegisterInput struct {
	DB       string
	Op       RegisterOp
	Value    int64 // RegWrite: the value written
	Bookmark int   // RegRestore: the bookmark restored to
	// Forget (RegRestore): no restore goes back to Bookmark after this
	// one; the state drops it (fewer distinct states to explore).
	Forget bool
	// Maybe: the outcome is unknown (a write or restore whose answer was
	// lost): it took effect between its call and return, or never.
	Maybe bool
}

// RegisterOutput is what an operation returned: a read's value, a
// bookmark's number, a restore's previous and new bookmarks (0: unknown,
// for a restore whose answer was lost).
type RegisterOutput struct {
	Value    int64
	Bookmark int
	Prev     int
	After    int
}

// RegisterState is one database's register and, for every bookmark taken
// so far, the value the register had at that point (encoded canonically so
// states compare with ==: sorted "id=value;" pairs).
type RegisterState struct {
	Value     int64
	Bookmarks string
}

// at returns the value recorded for bookmark id.
func (s RegisterState) at(id int) (int64, bool) {
	for _, p := range strings.Split(s.Bookmarks, ";") {
		k, v, ok := strings.Cut(p, "=")
		if ok && k == strconv.Itoa(id) {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n, true
		}
	}
	return 0, false
}

// without drops bookmark id.
func (s RegisterState) without(id int) RegisterState {
	prefix := strconv.Itoa(id) + "="
	var b strings.Builder
	for _, p := range strings.Split(s.Bookmarks, ";") {
		if p != "" && !strings.HasPrefix(p, prefix) {
			b.WriteString(p + ";")
		}
	}
	s.Bookmarks = b.String()
	return s
}

// with records that bookmark id names value. A bookmark names one point
// of the database's history, hence one value: naming another is illegal.
func (s RegisterState) with(id int, value int64) (RegisterState, bool) {
	if id == 0 {
		return s, true
	}
	if v, ok := s.at(id); ok {
		return s, v == value
	}
	type pair struct {
		id int
		v  int64
	}
	var ps []pair
	for _, p := range strings.Split(s.Bookmarks, ";") {
		if k, v, ok := strings.Cut(p, "="); ok {
			i, _ := strconv.Atoi(k)
			n, _ := strconv.ParseInt(v, 10, 64)
			ps = append(ps, pair{i, n})
		}
	}
	ps = append(ps, pair{id, value})
	sort.Slice(ps, func(i, j int) bool { return ps[i].id < ps[j].id })
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "%d=%d;", p.id, p.v)
	}
	s.Bookmarks = b.String()
	return s, true
}

// Register is a single integer register per database, initially 0: a read
// returns the last value written. Writes through the edge execute on the
// database's one object host, so the register must be linearizable across
// host kills and catalog faults alike.
//
// Time travel is part of it: a bookmark names the register's value at the
// instant it was taken, and a restore to a bookmark sets the register to
// that value — all of it or nothing: a restore whose answer was lost
// (host killed mid-restore) may have happened or not, never half. A
// restore's answer also names the point just before it (the previous
// bookmark, which undoes it) and the point it made; restoring to either
// must give that value back.
//
// An operation of unknown outcome (Input.Maybe) may have taken effect, at
// one instant between its call and its return, or not at all: the model is
// nondeterministic (porcupine's power-set construction keeps every state
// it may be in), so such an operation need not stay open to the end of the
// history to be allowed not to have happened — its caller can bound its
// return where it certainly could no longer take effect.
var Register = registerSteps.ToModel()

var registerSteps = porcupine.NondeterministicModel{
	Partition: partitionBy(func(in any) string { return in.(RegisterInput).DB }),
	Init:      func() []any { return []any{RegisterState{}} },
	Step: func(state, input, output any) []any {
		st, in := state.(RegisterState), input.(RegisterInput)
		out, _ := output.(RegisterOutput)
		next, ok := registerStep(st, in, out)
		switch {
		case in.Maybe && ok:
			return []any{st, next}
		case in.Maybe:
			return []any{st}
		case ok:
			return []any{next}
		}
		return nil
	},
	Equal: func(a, b any) bool { return a.(RegisterState) == b.(RegisterState) },
	Hash: func(state any) uint64 {
		st := state.(RegisterState)
		h := fnv.New64a()
		fmt.Fprintf(h, "%d|%s", st.Value, st.Bookmarks)
		return h.Sum64()
	},
	DescribeOperation: func(input, output any) string {
		in := input.(RegisterInput)
		out, _ := output.(RegisterOutput)
		maybe := ""
		if in.Maybe {
			maybe = " (outcome unknown)"
		}
		switch in.Op {
		case RegWrite:
			return fmt.Sprintf("write(%d)%s", in.Value, maybe)
		case RegRead:
			return fmt.Sprintf("read() → %d", out.Value)
		case RegBookmark:
			return fmt.Sprintf("bookmark() → #%d", out.Bookmark)
		default:
			if out.After == 0 {
				return fmt.Sprintf("restore(#%d)%s", in.Bookmark, maybe)
			}
			return fmt.Sprintf("restore(#%d) → previous #%d, now #%d", in.Bookmark, out.Prev, out.After)
		}
	},
	DescribeState: func(state any) string {
		st := state.(RegisterState)
		if st.Bookmarks == "" {
			return fmt.Sprint(st.Value)
		}
		return fmt.Sprintf("%d (bookmarks %s)", st.Value, strings.ReplaceAll(strings.TrimSuffix(st.Bookmarks, ";"), ";", " "))
	},
}

// registerStep is the register's sequential specification: the state after
// in with output out, and whether that step is legal.
func registerStep(st RegisterState, in RegisterInput, out RegisterOutput) (RegisterState, bool) {
	switch in.Op {
	case RegWrite:
		st.Value = in.Value
		return st, true
	case RegRead:
		return st, out.Value == st.Value
	case RegBookmark:
		return st.with(out.Bookmark, st.Value)
	default: // RegRestore
		v, ok := st.at(in.Bookmark)
		if !ok {
			return st, false // a bookmark not taken yet (or never)
		}
		if st, ok = st.with(out.Prev, st.Value); !ok {
			return st, false
		}
		if in.Forget {
			st = st.without(in.Bookmark)
		}
		st.Value = v
		return st.with(out.After, v)
	}
}

// ExistenceOp is what an operation does to a database's existence.
type ExistenceOp int

const (
	// Created: the create acknowledged with this UUID (its linearization
	// point is its catalog write, within the call).
	Created ExistenceOp = iota
	// Deleted: a delete; its output says whether it answered not-found.
	Deleted
	// Got: a linearizable read of the catalog row.
	Got
	// Listed: a linearizable list of the account's databases, projected
	// onto this one (validate.ExistenceOperations): found = it was listed.
	Listed
)

// ExistenceInput is one operation on one database's existence.
type ExistenceInput struct {
	DB string
	Op ExistenceOp
}

// ExistenceOutput is whether the database was found (Got), or whether the
// delete answered "not found" (Deleted, NotFound true).
type ExistenceOutput struct {
	Found    bool
	NotFound bool
}

// Existence is the catalog's view of one database: absent, then present
// from its create, then absent from its delete. A linearizable get — and
// a linearizable list of its account, which shows it exactly while it is
// present — sees exactly that; a delete of a present database succeeds and
// one of an absent database answers not-found.
var Existence = porcupine.Model{
	Partition: partitionBy(func(in any) string { return in.(ExistenceInput).DB }),
	Init:      func() any { return false },
	Step: func(state, input, output any) (bool, any) {
		exists := state.(bool)
		out, _ := output.(ExistenceOutput)
		switch input.(ExistenceInput).Op {
		case Created:
			return !exists, true
		case Deleted:
			if out.NotFound {
				return !exists, false
			}
			return exists, false
		default:
			return out.Found == exists, exists
		}
	},
	DescribeOperation: func(input, output any) string {
		out, _ := output.(ExistenceOutput)
		switch input.(ExistenceInput).Op {
		case Created:
			return "create"
		case Deleted:
			if out.NotFound {
				return "delete → not found"
			}
			return "delete"
		case Listed:
			return fmt.Sprintf("list → listed=%v", out.Found)
		default:
			return fmt.Sprintf("get → found=%v", out.Found)
		}
	},
	DescribeState: func(state any) string {
		if state.(bool) {
			return "exists"
		}
		return "absent"
	},
}

func partitionBy(key func(input any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(h []porcupine.Operation) [][]porcupine.Operation {
		idx := map[string]int{}
		var out [][]porcupine.Operation
		for _, op := range h {
			k := key(op.Input)
			i, ok := idx[k]
			if !ok {
				i = len(out)
				idx[k] = i
				out = append(out, nil)
			}
			out[i] = append(out[i], op)
		}
		return out
	}
}

// ExistenceResumed is Existence for the part of a history after the
// catalog was restored from an older backup (`shoal cluster restore`): an
// operator rewound the catalog, so a database's existence right after the
// restore is whatever the backup held — which the history cannot tell —
// and linearizability of the catalog's history across the restore cannot
// hold. Each database starts unknown; its first operation in the
// linearization decides the state it starts from (a get or a list
// observes it; a create needs it absent; a delete answered "not found"
// needs it absent, an acknowledged one present), and every later
// operation is held to Existence's rules.
var ExistenceResumed = porcupine.Model{
	Partition: partitionBy(func(in any) string { return in.(ExistenceInput).DB }),
	Init:      func() any { return resumedUnknown },
	Step: func(state, input, output any) (bool, any) {
		st := state.(resumedState)
		out, _ := output.(ExistenceOutput)
		op := input.(ExistenceInput).Op
		if st == resumedUnknown {
			switch op {
			case Created:
				return true, resumedExists
			case Deleted:
				return true, resumedAbsent
			default:
				if out.Found {
					return true, resumedExists
				}
				return true, resumedAbsent
			}
		}
		exists := st == resumedExists
		ok, next := Existence.Step(exists, input, output)
		if next.(bool) {
			return ok, resumedExists
		}
		return ok, resumedAbsent
	},
	DescribeOperation: Existence.DescribeOperation,
	DescribeState: func(state any) string {
		switch state.(resumedState) {
		case resumedUnknown:
			return "as the backup left it"
		case resumedExists:
			return "exists"
		}
		return "absent"
	},
}

// resumedState is ExistenceResumed's state.
type resumedState int8

const (
	resumedUnknown resumedState = iota
	resumedAbsent
	resumedExists
)
