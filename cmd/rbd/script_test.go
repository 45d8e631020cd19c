package main

import (
	"context"
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestMain lets testscript run the real rbd binary: scripts call `exec rbd`
// and get this test binary re-executed as rbd.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"rbd": func() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{Dir: "testdata/script", RequireExplicitExec: true})
}
