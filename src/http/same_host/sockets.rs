//! Where the same-host sockets live and binding them (`super`): the shared socket beside the
//! TCP port, each shard's own (`PATH.N`), what `/health` says of them, and the per-shard
//! sockets a killed server left.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the socket goes for `ock.mmc.http.same_host_socket` = `value` and the TCP `port`:
/// `None` when it is `off`. `auto`: `$XDG_RUNTIME_DIR/mmc-server/PORT.sock`, else
/// `/tmp/mmc-server-UID/PORT.sock`.
pub fn socket_path(value: &str, port: u16) -> Option<PathBuf> {
    match value {
        "off" | "" => None,
        "auto" => {
            let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
                Some(d) => PathBuf::from(d).join("mmc-server"),
                // SAFETY: geteuid has no preconditions.
                None => PathBuf::from(format!("/tmp/mmc-server-{}", unsafe { libc::geteuid() })),
            };
            Some(dir.join(format!("{port}.sock")))
        }
        path => Some(PathBuf::from(path)),
    }
}

/// Binds the socket at `path`: its directory is created (mode 0700) when missing and must
/// belong to the server's user and be closed to others when `private_dir` (the `auto` path);
/// a socket file left by an earlier process is replaced; the socket is mode 0600. Peers are
/// checked at accept all the same ([`LocalPeer::of`]).
pub fn bind(path: &Path, private_dir: bool) -> io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        if private_dir {
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            let meta = std::fs::symlink_metadata(dir)?;
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
                return Err(io::Error::other(format!(
                    "{} is not a directory of this user closed to others",
                    dir.display()
                )));
            }
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(io::Error::other(format!(
                "{} exists and is not a socket",
                path.display()
            )));
        }
        // A socket nobody listens on any more (or a live server's: then the bind below takes
        // its name, and that server's clients fall back to TCP once they reconnect).
        std::fs::remove_file(path)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Removes the sockets `PATH.N` beside the shared socket at `path` for `N` from `keep` on: a
/// server of this port killed before it could remove its per-shard sockets left them (a
/// later one with fewer shards, or none of their own, would leave them lying there for good).
/// The TCP port is this process's, so they are no live server's; only sockets go, nothing
/// else named so. Returns how many went.
pub fn remove_stale_shard_sockets(path: &Path, keep: usize) -> usize {
    use std::os::unix::fs::FileTypeExt;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(n) = file
            .to_str()
            .and_then(|f| f.strip_prefix(name))
            .and_then(|rest| rest.strip_prefix('.'))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if n >= keep && is_socket && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The socket's path as a header can carry it: `None` when it is not UTF-8 or holds a
/// control character.
pub fn header_path(path: &Path) -> Option<&str> {
    path.to_str().filter(|p| !p.chars().any(char::is_control))
}

/// The header lines `/health` answers with, each ending in CRLF: `X-Mmc-Same-Host: ID PATH`,
/// this process's id (so that a client can tell the socket it reaches belongs to the server it
/// talks to over TCP) and the socket's path (`header_path`); when every shard also listens on
/// a socket of its own ([`shard_path`]), `X-Mmc-Same-Host-Shards: N` too (a client then sends
/// a key's request to its owner's socket, the owner computed as `shards::shard_for` does, so
/// that no other shard takes part in it; a client that does not know it uses the shared
/// socket as before).
pub fn advert(boot_id: u32, path: &str, own_sockets: Option<usize>) -> Box<str> {
    let id = format!(
        "X-Mmc-Same-Host: {boot_id:08x}-{} {path}\r\n",
        std::process::id()
    );
    match own_sockets {
        Some(n) => format!("{id}X-Mmc-Same-Host-Shards: {n}\r\n").into(),
        None => id.into(),
    }
}

/// The socket of shard `shard` only, beside the shared one at `path`: `PATH.N`.
pub fn shard_path(path: &Path, shard: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{shard}"));
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_removes_the_per_shard_sockets_a_killed_one_of_its_port_left() {
        let dir = std::env::temp_dir().join(format!("mmc-stale-sockets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("8123.sock");
        let at = |suffix: &str| dir.join(format!("8123.sock{suffix}"));
        // Sockets nobody listens on (the listeners dropped, the files left), as after kill -9.
        for suffix in ["", ".0", ".1", ".12", ".x"] {
            drop(std::os::unix::net::UnixListener::bind(at(suffix)).unwrap());
        }
        drop(std::os::unix::net::UnixListener::bind(dir.join("9000.sock.1")).unwrap());
        std::fs::write(at(".5"), b"not a socket").unwrap();
        // Two shards of its own: .0 and .1 are its (rebound), .12 is stale.
        assert_eq!(remove_stale_shard_sockets(&path, 2), 1);
        assert!(at(".0").exists() && at(".1").exists() && !at(".12").exists());
        // None of its own: every PATH.N socket goes; the shared socket, another port's,
        // names that are not PATH.N and files that are not sockets stay.
        assert_eq!(remove_stale_shard_sockets(&path, 0), 2);
        assert!(!at(".0").exists() && !at(".1").exists());
        assert!(at("").exists() && at(".x").exists() && at(".5").exists());
        assert!(dir.join("9000.sock.1").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn auto_paths_are_per_port_in_a_private_directory() {
        assert!(socket_path("off", 8000).is_none());
        assert_eq!(
            socket_path("/run/x.sock", 8000).unwrap(),
            PathBuf::from("/run/x.sock")
        );
        let p = socket_path("auto", 8123).unwrap();
        assert!(p.ends_with("8123.sock"), "{}", p.display());
    }
}
