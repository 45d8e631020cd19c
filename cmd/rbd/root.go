package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// exitError carries a specific exit code (e.g. verify's 1 for damage).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "rbd",
		Short:         "rbd is a replay-buffer database for reinforcement learning",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newQuickstartCommand(), newServeCommand(), newDumpCommand(), newVerifyCommand(), newUpgradeCommand(), newCollectCommand(), newCheckpointCommand())
	return root
}

// run executes the CLI with args and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "rbd:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 2
}
