// Command keyshard is the one Keyshard binary.
//
//	keyshard demo [--mode hotkeys]                      see it work, with its own checks
//	keyshard serve                                      run the control plane (embedded etcd)
//	keyshard status | keyspace | members | map | drain   operate it
//	keyshard top                                        the dashboard's overview, refreshing
//	keyshard positions [reset]                          stream keyspaces' positions
//	keyshard hotkeys pool put|list, hotkeys set [--watch] cluster-wide hot keys
//	keyshard bench placement|control|hotkeys [--json]   measure it
//	keyshard chaos [--duration 10m] [--seed N]          break it on purpose, check every write
//
// Run `keyshard help` for every command and flag.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "keyshard:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "keyshard",
		Short:         "Keyshard: who owns which key, kept right while workers come and go",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServe(), newDemo(), newBench(), newHotKeys(), newChaos())
	addPoolCommands(root)
	addAdminCommands(root)
	return root
}
