package edge

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"github.com/vektah/gqlparser/v2/lexer"
	"github.com/vektah/gqlparser/v2/parser"
)

// Parsing of the subset of GraphQL's query language that D1's analytics
// clients send. The syntax is read by gqlparser (parser.ParseQuery: syntax
// only, there is no schema to validate against), and its AST is converted
// into the small types graphql.go executes. Accepted: one or more
// operations, each `query Name($var: Type = default, …) { selections }` or
// the `{ selections }` shorthand, where a selection is
// `alias: name(arg: value, …) { selections }` and a value is a variable,
// number, string (also block strings), boolean, null, enum, list or object.
// Refused, with an error naming them: fragments (definitions, spreads and
// inline fragments), directives, mutations and subscriptions; nothing is
// silently skipped. Descriptions and comments are ignored, as the spec
// says. Also refused: a \u escape naming a lone surrogate, which gqlparser
// would turn into U+FFFD.
//
// Bounds: the document is at most gqlMaxQueryBytes (checked before
// parsing), selections nest at most gqlMaxDepth deep, values and variable
// types at most gqlMaxDepth deep (checked while converting), so a hostile
// document costs linear time and bounded stack (gqlparser itself stops at
// parser.MaxNestingDepth).

const (
	gqlMaxQueryBytes = 32 << 10
	gqlMaxDepth      = 16
)

type gqlValueKind int

const (
	gqlVariable gqlValueKind = iota + 1
	gqlInt
	gqlFloat
	gqlString
	gqlBool
	gqlNull
	gqlEnumKind
	gqlList
	gqlObject
)

type gqlValue struct {
	kind   gqlValueKind
	text   string // variable name, number text, string value, enum name, "true"/"false"
	list   []gqlValue
	fields []gqlArg // object fields, in document order
}

type gqlArg struct {
	name  string
	value gqlValue
}

type gqlSelection struct {
	alias, name string
	args        []gqlArg
	sels        []gqlSelection
	hasSels     bool
}

// key is the selection's name in the answer.
func (s gqlSelection) key() string {
	if s.alias != "" {
		return s.alias
	}
	return s.name
}

type gqlVarDef struct {
	name string
	def  *gqlValue
}

type gqlOperation struct {
	kind string // "query"
	name string
	vars []gqlVarDef
	sels []gqlSelection
}

// gqlSyntaxError is a document the parser refuses; its message is for
// the client.
type gqlSyntaxError struct{ msg string }

func (e *gqlSyntaxError) Error() string { return e.msg }

func gqlSyntaxErrorAt(line, column int, format string, args ...any) *gqlSyntaxError {
	msg := "Syntax Error: " + fmt.Sprintf(format, args...)
	if line > 0 {
		msg += fmt.Sprintf(" (line %d, column %d)", line, column)
	}
	return &gqlSyntaxError{msg: msg}
}

// parseGraphQL parses a document into its operations.
func parseGraphQL(src string) ([]gqlOperation, error) {
	if len(src) > gqlMaxQueryBytes {
		return nil, gqlSyntaxErrorAt(0, 0, "the document is over %d bytes", gqlMaxQueryBytes)
	}
	source := &ast.Source{Input: src}
	doc, err := parser.ParseQuery(source)
	if err != nil {
		var ge *gqlerror.Error
		if !errors.As(err, &ge) {
			return nil, gqlSyntaxErrorAt(0, 0, "%s", err.Error())
		}
		line, column := 0, 0
		if len(ge.Locations) > 0 {
			line, column = ge.Locations[0].Line, ge.Locations[0].Column
		}
		// The parser reports a token its lexer refused as "Unexpected
		// <Invalid>"; the lexer's own error says what is wrong (an invalid
		// escape, number, character), so it is the one given when it is
		// where the parser stopped.
		if le := lexError(source); le != nil && len(le.Locations) > 0 {
			l := le.Locations[0]
			if l.Line < line || l.Line == line && l.Column <= column {
				ge, line, column = le, l.Line, l.Column
			}
		}
		return nil, gqlSyntaxErrorAt(line, column, "%s", ge.Message)
	}
	c := &gqlConverter{src: src}
	ops, err := c.document(doc)
	if err != nil {
		return nil, err
	}
	return ops, nil
}

// lexError is the first error of gqlparser's lexer on the document, nil
// when every token is valid.
func lexError(source *ast.Source) *gqlerror.Error {
	lx := lexer.New(source)
	for {
		tok, err := lx.ReadToken()
		if err != nil {
			var ge *gqlerror.Error
			if errors.As(err, &ge) {
				return ge
			}
			return nil
		}
		if tok.Kind == lexer.EOF {
			return nil
		}
	}
}

// gqlConverter turns gqlparser's AST into the types above, refusing what
// they do not carry.
type gqlConverter struct {
	src       string
	runeBytes []int // byte offset of each rune of src, built on first need
}

func (c *gqlConverter) fail(pos *ast.Position, format string, args ...any) error {
	if pos == nil {
		return gqlSyntaxErrorAt(0, 0, format, args...)
	}
	return gqlSyntaxErrorAt(pos.Line, pos.Column, format, args...)
}

func (c *gqlConverter) document(doc *ast.QueryDocument) ([]gqlOperation, error) {
	var ops []gqlOperation
	for _, od := range doc.Operations {
		op, err := c.operation(od)
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	if len(doc.Fragments) > 0 {
		f := doc.Fragments[0]
		return nil, c.fail(f.Position, "fragments are not supported (fragment %s)", f.Name)
	}
	if len(ops) == 0 {
		return nil, c.fail(doc.Position, "the document has no operation")
	}
	return ops, nil
}

func (c *gqlConverter) operation(od *ast.OperationDefinition) (gqlOperation, error) {
	switch od.Operation {
	case ast.Query:
	case ast.Mutation, ast.Subscription:
		return gqlOperation{}, c.fail(od.Position, "%ss are not supported: this endpoint answers queries only", od.Operation)
	default:
		return gqlOperation{}, c.fail(od.Position, "operation %q is not supported", od.Operation)
	}
	op := gqlOperation{kind: "query", name: od.Name}
	for _, vd := range od.VariableDefinitions {
		if err := c.typeRef(vd.Type, 0); err != nil {
			return gqlOperation{}, err
		}
		if err := c.noDirectives(vd.Directives); err != nil {
			return gqlOperation{}, err
		}
		v := gqlVarDef{name: vd.Variable}
		if vd.DefaultValue != nil {
			d, err := c.value(vd.DefaultValue, 0)
			if err != nil {
				return gqlOperation{}, err
			}
			v.def = &d
		}
		op.vars = append(op.vars, v)
	}
	if err := c.noDirectives(od.Directives); err != nil {
		return gqlOperation{}, err
	}
	sels, err := c.selectionSet(od.SelectionSet, od.Position, 1)
	if err != nil {
		return gqlOperation{}, err
	}
	op.sels = sels
	return op, nil
}

func (c *gqlConverter) noDirectives(ds ast.DirectiveList) error {
	if len(ds) > 0 {
		return c.fail(ds[0].Position, "directives are not supported (@%s)", ds[0].Name)
	}
	return nil
}

// typeRef checks a variable's type only for depth: variables are checked
// where they are used, against what the field accepts.
func (c *gqlConverter) typeRef(t *ast.Type, depth int) error {
	if t == nil {
		return nil
	}
	if depth > gqlMaxDepth {
		return c.fail(t.Position, "type nested more than %d deep", gqlMaxDepth)
	}
	return c.typeRef(t.Elem, depth+1)
}

func (c *gqlConverter) selectionSet(set ast.SelectionSet, at *ast.Position, depth int) ([]gqlSelection, error) {
	if depth > gqlMaxDepth {
		if len(set) > 0 {
			at = set[0].GetPosition()
		}
		return nil, c.fail(at, "selections nested more than %d deep", gqlMaxDepth)
	}
	if len(set) == 0 { // gqlparser refuses `{}`; kept for safety
		return nil, c.fail(at, "empty selection set")
	}
	sels := make([]gqlSelection, 0, len(set))
	for _, s := range set {
		switch f := s.(type) {
		case *ast.Field:
			sel, err := c.field(f, depth)
			if err != nil {
				return nil, err
			}
			sels = append(sels, sel)
		case *ast.FragmentSpread:
			return nil, c.fail(f.Position, "fragments are not supported (...%s)", f.Name)
		case *ast.InlineFragment:
			what := "an inline fragment"
			if f.TypeCondition != "" {
				what += " on " + f.TypeCondition
			}
			return nil, c.fail(f.Position, "fragments are not supported (%s)", what)
		default:
			return nil, c.fail(s.GetPosition(), "selection %T is not supported", s)
		}
	}
	return sels, nil
}

func (c *gqlConverter) field(f *ast.Field, depth int) (gqlSelection, error) {
	s := gqlSelection{name: f.Name}
	if f.Alias != f.Name { // gqlparser sets Alias to Name when there is none
		s.alias = f.Alias
	}
	for _, a := range f.Arguments {
		v, err := c.value(a.Value, 0)
		if err != nil {
			return gqlSelection{}, err
		}
		s.args = append(s.args, gqlArg{name: a.Name, value: v})
	}
	if err := c.noDirectives(f.Directives); err != nil {
		return gqlSelection{}, err
	}
	if f.SelectionSet != nil {
		sels, err := c.selectionSet(f.SelectionSet, f.Position, depth+1)
		if err != nil {
			return gqlSelection{}, err
		}
		s.sels, s.hasSels = sels, true
	}
	return s, nil
}

func (c *gqlConverter) value(v *ast.Value, depth int) (gqlValue, error) {
	if v == nil {
		return gqlValue{}, c.fail(nil, "missing value")
	}
	if depth > gqlMaxDepth {
		return gqlValue{}, c.fail(v.Position, "value nested more than %d deep", gqlMaxDepth)
	}
	switch v.Kind {
	case ast.Variable:
		return gqlValue{kind: gqlVariable, text: v.Raw}, nil
	case ast.IntValue, ast.FloatValue:
		if err := c.checkNumberEnd(v); err != nil {
			return gqlValue{}, err
		}
		if v.Kind == ast.IntValue {
			return gqlValue{kind: gqlInt, text: v.Raw}, nil
		}
		return gqlValue{kind: gqlFloat, text: v.Raw}, nil
	case ast.StringValue:
		if err := c.checkSurrogates(v); err != nil {
			return gqlValue{}, err
		}
		return gqlValue{kind: gqlString, text: v.Raw}, nil
	case ast.BlockValue:
		return gqlValue{kind: gqlString, text: v.Raw}, nil
	case ast.BooleanValue:
		return gqlValue{kind: gqlBool, text: v.Raw}, nil
	case ast.NullValue:
		return gqlValue{kind: gqlNull}, nil
	case ast.EnumValue:
		return gqlValue{kind: gqlEnumKind, text: v.Raw}, nil
	case ast.ListValue:
		out := gqlValue{kind: gqlList}
		for _, e := range v.Children {
			ev, err := c.value(e.Value, depth+1)
			if err != nil {
				return gqlValue{}, err
			}
			out.list = append(out.list, ev)
		}
		return out, nil
	case ast.ObjectValue:
		out := gqlValue{kind: gqlObject}
		for _, e := range v.Children {
			ev, err := c.value(e.Value, depth+1)
			if err != nil {
				return gqlValue{}, err
			}
			out.fields = append(out.fields, gqlArg{name: e.Name, value: ev})
		}
		return out, nil
	}
	return gqlValue{}, c.fail(v.Position, "unsupported value")
}

// checkNumberEnd refuses a number followed by a name or a dot, such as
// 0x1 or 1_000: the spec makes that a syntax error, gqlparser's lexer
// would read it as a number then a name (0, x1).
func (c *gqlConverter) checkNumberEnd(v *ast.Value) error {
	if v.Position == nil {
		return nil
	}
	at, ok := c.byteAt(v.Position.End)
	if !ok || at >= len(c.src) {
		return nil
	}
	if b := c.src[at]; b == '.' || b == '_' || (b >= '0' && b <= '9') || (b|0x20 >= 'a' && b|0x20 <= 'z') {
		return c.fail(v.Position, "Invalid number, unexpected %q after %s: a number cannot be followed by a name", string(rune(b)), v.Raw)
	}
	return nil
}

// checkSurrogates refuses a string whose \uXXXX escapes name a surrogate
// that is not half of a pair: gqlparser decodes it to U+FFFD, the spec
// calls it a syntax error. Only strings whose value holds U+FFFD can have
// one, so only those are looked at in the source.
func (c *gqlConverter) checkSurrogates(v *ast.Value) error {
	if v.Position == nil || !strings.ContainsRune(v.Raw, utf8.RuneError) {
		return nil
	}
	raw, ok := c.sourceRunes(v.Position.Start, v.Position.End)
	if !ok {
		return nil
	}
	for i := 0; i+1 < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if raw[i+1] != 'u' || i+6 > len(raw) {
			i++ // a two-character escape such as \\ or \"
			continue
		}
		n, err := strconv.ParseUint(raw[i+2:i+6], 16, 32)
		if err != nil { // a braced \u{…}: gqlparser already refuses surrogates there
			i++
			continue
		}
		if n >= 0xD800 && n <= 0xDBFF && i+12 <= len(raw) && raw[i+6:i+8] == `\u` {
			if lo, err := strconv.ParseUint(raw[i+8:i+12], 16, 32); err == nil && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 11 // a surrogate pair: one character
				continue
			}
		}
		if n >= 0xD800 && n <= 0xDFFF {
			return c.fail(v.Position, "invalid unicode escape \\u%s: a lone surrogate is not a character", raw[i+2:i+6])
		}
		i += 5
	}
	return nil
}

// sourceRunes is src from rune offset start to end (gqlparser's positions
// count runes).
func (c *gqlConverter) sourceRunes(start, end int) (string, bool) {
	from, ok1 := c.byteAt(start)
	to, ok2 := c.byteAt(end)
	if !ok1 || !ok2 || to < from {
		return "", false
	}
	return c.src[from:to], true
}

// byteAt is the byte offset of rune offset n of src (len(src) for the end).
func (c *gqlConverter) byteAt(n int) (int, bool) {
	if c.runeBytes == nil {
		c.runeBytes = make([]int, 0, len(c.src)+1)
		for i := range c.src {
			c.runeBytes = append(c.runeBytes, i)
		}
		c.runeBytes = append(c.runeBytes, len(c.src))
	}
	if n < 0 || n >= len(c.runeBytes) {
		return 0, false
	}
	return c.runeBytes[n], true
}
