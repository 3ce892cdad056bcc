package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/hookwright/hookwright/internal/version"
)

func init() {
	subcommands = append(subcommands, func() *cobra.Command {
		return &cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run: func(cmd *cobra.Command, _ []string) {
				fmt.Fprintln(cmd.OutOrStdout(), version.String())
			},
		}
	})
}
