// Package oci turns an image in an OCI or Docker registry into a root
// filesystem directory: Pull resolves a reference (tag or digest, with
// registry auth and platform selection), Unpack applies the image's layers
// into a directory the way container runtimes do, and Store keeps unpacked
// trees content-addressed so every template made from the same layers
// shares one tree.
//
// # Registries
//
// Credentials are those of Options alone: given ones, or a Keychain the
// caller supplies; never the host's Docker configuration. A Floor's
// Transport keeps every connection (the registry's and each redirect's)
// off the addresses it lists, checked on the address dialled, so a
// reference cannot make the caller fetch from its LAN or a cloud
// metadata address.
//
// # Unpacking
//
// Layers are applied in order. Whiteouts (.wh.<name>) delete <name> from
// lower layers; an opaque marker (.wh..wh..opq) empties its directory of
// everything lower layers put there. Regular files, directories,
// symlinks, hard links, character and block devices and FIFOs are created
// with their exact mode (setuid, setgid and sticky included), numeric owner
// and modification time; directory times are applied after the last layer
// so later entries do not disturb them. Unpacking therefore needs root
// (CAP_CHOWN, CAP_MKNOD, CAP_FOWNER).
//
// Symlinks already in the tree are resolved the way a chroot would: an
// absolute target is taken from the tree's root, ".." stops at the root, and
// the final component of an entry is never followed. Every file operation
// goes through an os.Root opened on the tree plus *at system calls on a
// directory descriptor obtained from it, so a hostile layer (a symlink to
// /etc, or to ../../..) cannot make a later entry write outside the tree.
// Entry names that are absolute or contain "..", and hard links naming such
// a target, are refused with errdefs.ErrInvalidArgument. The total bytes of
// file data and the number of entries are bounded by Limits.
//
// Every layer's uncompressed stream is hashed and checked against its
// diffID from the image configuration (the registry client already checks
// each compressed blob against its digest); a mismatch is
// errdefs.ErrDataLoss.
//
// Deliberately not supported:
//   - extended attributes (PAX SCHILY.xattr.*, including security.capability
//     file capabilities) and POSIX ACLs are ignored;
//   - user and group names in tar headers are ignored: owners are numeric;
//   - non-tar layers (Windows, foreign/non-distributable layers, artifacts)
//     are refused with errdefs.ErrInvalidArgument;
//   - a whiteout removes only what lower layers put there: an entry written
//     earlier in the same layer survives it, as the OCI image spec says.
//
// # Store keys
//
// A tree is keyed by the ChainID of the image's layer diffIDs (the OCI image
// spec's identifier of an applied layer stack), not by the manifest or
// config digest: the unpacked tree depends only on the ordered uncompressed
// layers, so images that differ only in configuration (entrypoint, env,
// labels) or in layer compression share one tree, and the key is checked
// while unpacking because every diffID is verified.
package oci
