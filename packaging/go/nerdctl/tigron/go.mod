// nerdctl's test framework is a nested module of its repository that is published nowhere; its
// release builds replace it with the directory. nerdctl's binary reaches it only through test
// helpers (pkg/testutil's compose.go names the interface type tig.T), so this stand-in declares
// that type and nothing else.
module github.com/containerd/nerdctl/mod/tigron

go 1.23.0
