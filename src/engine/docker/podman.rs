//! What differs when the daemon is Podman's Docker-compatible service: Podman reads the
//! seccomp security option as a path to a profile file on its own host, where Docker takes
//! the profile inline (`seccomp={"defaultAction":...}`); given the inline form Podman fails
//! every create with "opening seccomp profile failed: open {"archMap":...": no such file".
//! So for Podman on a local socket the same profile is written once to a file that Podman can
//! read, and the option names that file; for Podman on another host it is refused.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// How the daemon takes codebox's seccomp profile.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum SeccompForm {
    /// Docker: inline, as the spec has it.
    Inline,
    /// Podman on this host: the profile in this file.
    File(PathBuf),
    /// Podman elsewhere: no file codebox writes is on its host. The message says what to do.
    Refused(String),
}

/// Whether a daemon's version answer is Podman's (its components name "Podman Engine").
pub(super) fn is_podman<'a>(component_names: impl IntoIterator<Item = &'a str>) -> bool {
    component_names
        .into_iter()
        .any(|n| n.to_ascii_lowercase().contains("podman"))
}

/// Whether the daemon's address is a socket on this host.
fn is_local(address: &str) -> bool {
    address.starts_with("unix://") || address.starts_with('/')
}

/// The form for a daemon at `address`, writing the profile file into `dir` where it is
/// Podman on this host.
pub(super) fn seccomp_form(podman: bool, address: &str, profile: &str, dir: &Path) -> SeccompForm {
    if !podman {
        return SeccompForm::Inline;
    }
    if !is_local(address) {
        return SeccompForm::Refused(format!(
            "the daemon at {address} is Podman, which reads the seccomp profile as a file on its \
             own host, and codebox cannot put one there: run codebox on the Podman host and point \
             DOCKER_HOST (docker.host) at its socket (unix:///run/podman/podman.sock, or \
             unix://$XDG_RUNTIME_DIR/podman/podman.sock for rootless Podman)"
        ));
    }
    match write_profile(profile, dir) {
        Ok(path) => SeccompForm::File(path),
        Err(e) => SeccompForm::Refused(format!(
            "the daemon is Podman, which reads the seccomp profile from a file, and codebox \
             could not write it into {}: {e} (set TMPDIR to a folder codebox can write and \
             Podman can read)",
            dir.display()
        )),
    }
}

/// Write the profile to `dir/codebox-seccomp-<hash>.json` (readable by everyone: a rootless
/// Podman runs as another user), replacing it atomically; the same profile gives the same
/// file.
fn write_profile(profile: &str, dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let hash = Sha256::digest(profile.as_bytes());
    let name: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("codebox-seccomp-{name}.json"));
    if std::fs::read_to_string(&path).is_ok_and(|old| old == profile) {
        return Ok(path);
    }
    let tmp = dir.join(format!("codebox-seccomp-{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, profile)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(path)
}

/// The security options with the inline seccomp profile replaced by `file`.
pub(super) fn with_profile_file(options: &[String], file: &Path) -> Vec<String> {
    options
        .iter()
        .map(|o| match o.strip_prefix("seccomp=") {
            Some(p) if p.starts_with('{') => format!("seccomp={}", file.display()),
            _ => o.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_gets_the_same_profile_as_a_file_and_docker_gets_it_inline() {
        let dir = tempfile::tempdir().unwrap();
        let profile = r#"{"defaultAction":"SCMP_ACT_ERRNO"}"#;
        assert_eq!(
            seccomp_form(false, "unix:///var/run/docker.sock", profile, dir.path()),
            SeccompForm::Inline
        );
        let SeccompForm::File(path) =
            seccomp_form(true, "unix:///run/podman/podman.sock", profile, dir.path())
        else {
            panic!("Podman on a local socket must get a file");
        };
        assert_eq!(std::fs::read_to_string(&path).unwrap(), profile);
        let opts = vec![
            "no-new-privileges".to_string(),
            format!("seccomp={profile}"),
        ];
        assert_eq!(
            with_profile_file(&opts, &path),
            vec![
                "no-new-privileges".to_string(),
                format!("seccomp={}", path.display())
            ]
        );
        // The same profile again: the same file, nothing else left in the folder.
        assert_eq!(
            seccomp_form(true, "unix:///run/podman/podman.sock", profile, dir.path()),
            SeccompForm::File(path)
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn podman_on_another_host_is_refused_with_what_to_change() {
        let dir = tempfile::tempdir().unwrap();
        let SeccompForm::Refused(why) = seccomp_form(true, "tcp://10.0.0.5:2375", "{}", dir.path())
        else {
            panic!("a remote Podman cannot read a local file");
        };
        assert!(why.contains("DOCKER_HOST"), "{why}");
        assert!(is_podman(["Podman Engine"]));
        assert!(!is_podman(["Engine", "containerd", "runc"]));
    }
}
