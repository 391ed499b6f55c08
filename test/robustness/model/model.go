// Package model holds the sequential specifications porcupine checks the
// robustness suite's histories against. Each model partitions its history by
// database: one database's operations never constrain another's, and small
// partitions keep the check fast.
package model

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// RegisterInput is one operation on a database's register (table reg, row
// k = 0): a write of Value, or a read.
type RegisterInput struct {
	DB    string
	Write bool
	Value int64
}

// RegisterOutput is what a read returned (ignored for writes).
type RegisterOutput struct{ Value int64 }

// Register is a single integer register per database, initially 0: a read
// returns the last value written. Writes through the edge execute on the
// database's one object host, so the register must be linearizable across
// host kills and catalog faults alike.
var Register = porcupine.Model{
	Partition: partitionBy(func(in any) string { return in.(RegisterInput).DB }),
	Init:      func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(RegisterInput)
		if in.Write {
			return true, in.Value
		}
		return output.(RegisterOutput).Value == state.(int64), state
	},
	Equal: func(a, b any) bool { return a.(int64) == b.(int64) },
	DescribeOperation: func(input, output any) string {
		in := input.(RegisterInput)
		if in.Write {
			return fmt.Sprintf("write(%d)", in.Value)
		}
		return fmt.Sprintf("read() → %d", output.(RegisterOutput).Value)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state.(int64)) },
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
// from its create, then absent from its delete. A linearizable get sees
// exactly that; a delete of a present database succeeds and one of an
// absent database answers not-found.
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
