package fsm

import "context"

// CmdNoop changes nothing but the applied index. The leader proposes one
// per term (so a read index is reachable) and after a restore; its body is
// ignored.
const CmdNoop CommandType = "noop"

var noopCommand = command[struct{}, noStmts]{
	bodyless: true,
	validate: func(*struct{}) error { return nil },
	apply:    func(*FSM, context.Context, *Command, noStmts, *struct{}) (any, error) { return nil, nil },
}
