package cli

import (
	"os"
	"os/user"
	"strconv"

	ucli "github.com/urfave/cli/v2"

	"gpukit/libgpu/ipc"
)

// PeerFlags are the flags that choose which peers a daemon serves:
// --allow-uid (repeatable) and --group. who says what the daemon does for
// them ("connect", "send events").
func PeerFlags(who string) []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringSliceFlag{Name: "allow-uid", Usage: "UID: this uid may " + who + " too (repeatable; the daemon's own uid and root always may)"},
		&ucli.StringFlag{Name: "group", Usage: "GROUP (name or gid): the socket's group (mode 0660), and its members may " + who},
	}
}

// LookupGroup reads a group name or gid (a usage error when it names none).
func LookupGroup(g string) (uint32, error) {
	if n, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uint32(n), nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, Usagef("--group %q: %v", g, err)
	}
	n, err := strconv.ParseUint(gr.Gid, 10, 32)
	if err != nil {
		return 0, Usagef("--group %q has gid %q", g, gr.Gid)
	}
	return uint32(n), nil
}

// AllowUIDs reads --allow-uid (numeric uids).
func AllowUIDs(c *ucli.Context) ([]uint32, error) {
	var out []uint32
	for _, a := range c.StringSlice("allow-uid") {
		uid, err := strconv.ParseUint(a, 10, 32)
		if err != nil {
			return nil, Usagef("--allow-uid %q: want a numeric uid", a)
		}
		out = append(out, uint32(uid))
	}
	return out, nil
}

// Admission reads PeerFlags into the admission of the optimizer service
// and the tracer collector: the daemon's own uid, root, --allow-uid and
// the members of --group (ipc.Admission). gid is --group's (-1 when not
// given): the socket's and its directory's group.
func Admission(c *ucli.Context) (a ipc.Admission, gid int, err error) {
	a = ipc.Admission{Self: uint32(os.Geteuid()), Root: true}
	if a.UIDs, err = AllowUIDs(c); err != nil {
		return a, -1, err
	}
	gid = -1
	if g := c.String("group"); g != "" {
		n, err := LookupGroup(g)
		if err != nil {
			return a, -1, err
		}
		a.GIDs, gid = []uint32{n}, int(n)
	}
	return a, gid, nil
}
