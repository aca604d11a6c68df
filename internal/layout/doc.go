// Package layout holds the module's layout tests; it has no code of its
// own. They read the repository as it is checked out:
//
//   - the import tiers of internal/README.md, as a table in layout_test.go
//     checked against what `go list` reports for every package of the
//     module: an import goes down the table, never up, and every package
//     has a tier;
//   - no tracked file names the tools the developers use outside the
//     project.
//
// Run them with
//
//	go test ./internal/layout/
package layout
