package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume"
)

func newVolumeCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Manage volumes: named file trees that outlive sandboxes",
		Long: `Volumes are E2B's, with Spore's modes: a shared volume (the default, what the
stock SDK creates) is read-write by many sandboxes and outside snapshots; an
exclusive one (--exclusive) is held by one sandbox at a time and captured with
its snapshots. Each has a size (its quota). Sandboxes mount them with
spore start --volume NAME:/path[:ro]; spore volume cp and files reach their
content from here. See docs/volumes.md for what works today.`,
	}
	cmd.AddCommand(newVolumeCreateCmd(f), newVolumeListCmd(f), newVolumeInfoCmd(f), newVolumeRmCmd(f), newVolumeCpCmd(f), newVolumeFilesCmd(f))
	return cmd
}

func newVolumeCreateCmd(f *cliFlags) *cobra.Command {
	var exclusive bool
	var size string
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var sizeMB int64
			if size != "" {
				n, err := volume.ParseSize(size)
				if err != nil {
					return err
				}
				if n < volume.MiB {
					return fmt.Errorf("--size %s: the smallest volume is %s", size, volume.FormatSize(volume.MinSize))
				}
				sizeMB = n / volume.MiB
			}
			mode := store.VolumeShared
			if exclusive {
				mode = store.VolumeExclusive
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], mode, sizeMB)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s %s\n", v.VolumeID, v.Name, v.Mode, volume.FormatSize(v.SizeMB*volume.MiB))
			return nil
		},
	}
	cmd.Flags().BoolVar(&exclusive, "exclusive", false, "one sandbox at a time, captured with its snapshots (default: shared)")
	cmd.Flags().StringVar(&size, "size", "", "the quota, like 512M or 10G (default "+volume.FormatSize(volume.DefaultSize)+")")
	return cmd
}

func volumeRow(v api.Volume) []string {
	return []string{v.VolumeID, v.Name, v.Mode, volume.FormatSize(v.SizeMB * volume.MiB), ago(v.CreatedAt)}
}

func newVolumeListCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List volumes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, v := range list {
				rows = append(rows, volumeRow(v))
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tMODE\tSIZE\tCREATED", rows)
			return nil
		},
	}
}

func newVolumeInfoCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "info NAME|ID",
		Short: "Show a volume and its usage (--json: with its content token)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			v, err := c.Volume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			used := "-" // no node holds any content yet, or its node did not answer
			if v.Usage != nil {
				used = fmt.Sprintf("%s of %s", volume.FormatSize(v.Usage.UsedBytes), volume.FormatSize(v.Usage.CapacityBytes))
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tMODE\tSIZE\tCREATED\tUSED", [][]string{append(volumeRow(v.Volume), used)})
			return nil
		},
	}
}

func newVolumeRmCmd(f *cliFlags) *cobra.Command {
	return newRmCmd(f, "rm NAME|ID...", "Delete volumes and their content (a volume a sandbox holds is refused)", (*client.Client).DeleteVolume)
}
