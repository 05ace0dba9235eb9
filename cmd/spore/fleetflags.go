package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/spore-run/spore/internal/server"
)

// fleetFlags are how `spore api` and `spore node` authenticate each other:
// a fleet CA (mutual TLS), or --insecure-fleet with a cluster token.
type fleetFlags struct {
	insecure                bool
	tokenFile, joinFile     string
	ca, caKey, listen, name string
	replica                 bool
}

func addFleetFlags(f *pflag.FlagSet, replica bool) *fleetFlags {
	ff := &fleetFlags{replica: replica}
	f.BoolVar(&ff.insecure, "insecure-fleet", false, "no fleet TLS: cleartext between replicas and nodes, and one shared token (--cluster-token-file) is every identity; for trusted test networks only")
	f.StringVar(&ff.tokenFile, "cluster-token-file", "", "with --insecure-fleet: the file holding the token replicas and nodes share (at least 16 characters)")
	f.StringVar(&ff.joinFile, "join-token-file", "", "the fleet's join token (a file): replicas admit a node's first enrollment with it; a node without a certificate enrolls with it")
	if replica {
		f.StringVar(&ff.ca, "fleet-ca", "", "the fleet CA certificate (PEM; a bundle during a CA rotation): `spore fleet ca init` makes it")
		f.StringVar(&ff.caKey, "fleet-ca-key", "", "the fleet CA's key (mode 0600): replicas sign node certificates and their own with it")
		f.StringVar(&ff.listen, "fleet-listen", "127.0.0.1:3200", "the fleet listener (TLS): nodes register and enroll there (their --api-url: https://this)")
		f.StringVar(&ff.name, "fleet-name", "", "this replica's name in its fleet certificate (default: the host name and a random suffix)")
	} else {
		f.StringVar(&ff.ca, "fleet-ca", "", "the fleet CA certificate (PEM) the replicas' certificates are checked with (default: the one kept in <data-dir>/fleet)")
	}
	return ff
}

func (ff *fleetFlags) config() (server.FleetConfig, error) {
	c := server.FleetConfig{Insecure: ff.insecure, CAFile: ff.ca, CAKeyFile: ff.caKey, Listen: ff.listen, Name: ff.name}
	var err error
	if ff.insecure {
		if ff.tokenFile == "" {
			return c, fmt.Errorf("--insecure-fleet needs --cluster-token-file")
		}
		if c.Token, err = server.ReadToken(ff.tokenFile); err != nil {
			return c, err
		}
		return c, nil
	}
	if ff.tokenFile != "" {
		return c, fmt.Errorf("--cluster-token-file is for --insecure-fleet only: a fleet with TLS authenticates by certificates (--fleet-ca)")
	}
	if ff.joinFile != "" {
		if c.JoinToken, err = server.ReadToken(ff.joinFile); err != nil {
			return c, fmt.Errorf("--join-token-file: %w", err)
		}
	}
	return c, nil
}
