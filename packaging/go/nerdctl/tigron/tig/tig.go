// Package tig stands in for nerdctl's test framework: the one type its binary names.
package tig

// T is what nerdctl's test helpers ask of a test (*testing.T satisfies it).
type T interface {
	Log(args ...any)
	FailNow()
}
