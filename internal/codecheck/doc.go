// Package codecheck holds tests about the repository's source itself, not
// about what any package does; it has no code of its own.
//
// # Function length
//
// TestFunctionLength parses every non-test .go file of the three modules
// (the root, bench/ and deploy/) with go/parser and fails, naming
// file:line, the function and its length, for any function, declared or
// literal, that spans more than 100 lines from its func line to its closing
// brace, and for any over 80 lines without a written reason: a comment line
// starting "// Long:" in the comment block directly above its func line. A
// long function is usually several steps that deserve names; the reason
// says why this one is not.
//
// An explicit allow-list in the test exempts the few functions being split
// on other branches; it is meant to shrink to nothing.
// TestFunctionLengthCatchesFaults checks the check on a tree made for it.
//
// # Layers
//
// TestLayers lists the root module's packages with their imports (go list,
// tests' imports aside) and fails when a package imports one of its own
// layer or of a layer above, when a production package imports the test
// harness, or when a package has no layer. The layers are written once, in
// layers_test.go; docs/architecture.md shows them, generated from there
// (TestLayersDoc; SLUICE_UPDATE_DOCS=1 rewrites the page's table).
// TestLayersCatchFaults checks the check on a graph made for it.
//
// # Key table
//
// TestKeysTableDoc keeps docs/architecture.md's "Redis keys" table equal
// to keyspace.Table, the table of every key Sluice writes or reads, in the
// package that builds them (SLUICE_UPDATE_DOCS=1 rewrites the page's table).
package codecheck
