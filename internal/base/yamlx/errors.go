package yamlx

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error about a document's content: its
// syntax, an unknown key, a value of the wrong type, a second document.
var ErrInvalid = errors.New("yamlx: invalid YAML")

// Error is one problem at one place of a document. Several are returned
// joined with errors.Join, in line order.
type Error struct {
	// File is the file's name as given to DecodeFile; "" for a node.
	File string
	// Line is 1-based; 0 when yaml.v3 did not say.
	Line int
	// Path is the key path from the decoded root: "nats.url",
	// "routes[2].prefix"; "" for the root itself.
	Path string
	// Msg says what is wrong.
	Msg string
	// Err is an error of the caller's to wrap besides ErrInvalid (a
	// package's own sentinel), or nil.
	Err error
}

// Error reads "file:line: path: msg", leaving out what is unknown.
func (e *Error) Error() string {
	var where string
	switch {
	case e.File != "" && e.Line > 0:
		where = fmt.Sprintf("%s:%d: ", e.File, e.Line)
	case e.File != "":
		where = e.File + ": "
	case e.Line > 0:
		where = fmt.Sprintf("line %d: ", e.Line)
	}
	if e.Path != "" {
		where += e.Path + ": "
	}
	return where + e.Msg
}

// Unwrap returns ErrInvalid and Err.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalid, e.Err}
	}
	return []error{ErrInvalid}
}

// Errors returns every *Error within err (err itself, or errors joined or
// wrapped in it), in the order they appear.
func Errors(err error) []*Error {
	var out []*Error
	var visit func(error)
	visit = func(err error) {
		switch e := err.(type) {
		case nil:
		case *Error:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				visit(inner)
			}
		case interface{ Unwrap() error }:
			visit(e.Unwrap())
		}
	}
	visit(err)
	return out
}
