//! What differs when the daemon is Podman's Docker-compatible service: Podman reads the
//! seccomp security option as a path to a profile file on its own host, where Docker takes
//! the profile inline (`seccomp={"defaultAction":...}`); given the inline form Podman fails
//! every create with "opening seccomp profile failed: open {"archMap":...": no such file".
//! So for Podman on a local socket the same profile is written once to a file that Podman can
//! read, and the option names that file; for Podman on another host it is refused.
//!
//! Podman also refuses the tmpfs options `uid=` and `gid=` ("unknown mount option
//! \"uid=10016\": invalid mount option") that give the working directory to the sandbox user.
//! Its own option `U` does the same (libpod mounts the tmpfs with the uid and gid of the
//! container's user), so a tmpfs given to exactly the container's user gets `U` instead; one
//! given to anyone else cannot be said to Podman and is refused. Podman gets no memory
//! swappiness (crun refuses it on cgroup v2); swap is off through the equal memory and
//! memory+swap limits. Podman 4's API has no container update (`/containers/{id}/update`
//! answers 404 "Not Found"): the pool then keeps containers of each limit class instead of
//! changing a ready container's limits, and the error says so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::models::ContainerCreateBody;
use sha2::{Digest, Sha256};

use super::spec::create_body;
use crate::engine::ContainerSpec;

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

/// How one daemon is spoken to, learnt from its version answer at the first create.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Dialect {
    /// Podman's Docker-compatible service rather than Docker.
    pub podman: bool,
    pub seccomp: SeccompForm,
    /// Podman's default runtime, the one every container gets (empty for Docker).
    pub default_runtime: String,
}

impl Dialect {
    /// Docker's: the spec as it is.
    #[cfg(test)]
    pub fn docker() -> Dialect {
        Dialect {
            podman: false,
            seccomp: SeccompForm::Inline,
            default_runtime: String::new(),
        }
    }

    /// The create body for `spec` in this dialect, or why the daemon cannot be given it.
    pub(super) fn create_body(&self, spec: &ContainerSpec) -> Result<ContainerCreateBody, String> {
        let mut body = create_body(spec);
        let Some(host) = body.host_config.as_mut() else {
            return Ok(body);
        };
        match &self.seccomp {
            SeccompForm::Inline => {}
            SeccompForm::File(path) => {
                host.security_opt = Some(with_profile_file(&spec.security_opt, path));
            }
            SeccompForm::Refused(why) => return Err(why.clone()),
        }
        if self.podman {
            if let Some(why) =
                crate::engine::podman_runtime_problem(&spec.runtime, &self.default_runtime)
            {
                return Err(why);
            }
            // Podman hands swappiness to the OCI runtime, and crun refuses to start a
            // container with it on cgroup v2 ("cannot set memory swappiness with cgroupv2"),
            // where Docker drops it with a warning. Swap stays off either way: the memory
            // and memory+swap limits are equal.
            host.memory_swappiness = None;
            let mut tmpfs = HashMap::new();
            for (path, options) in &spec.tmpfs {
                tmpfs.insert(path.clone(), podman_tmpfs(path, options, &spec.user)?);
            }
            host.tmpfs = Some(tmpfs);
        }
        Ok(body)
    }
}

/// Podman's spelling of a tmpfs's options: `uid=N,gid=M` becomes `U` when `N:M` is the
/// container's user (`user`, as the spec has it: `uid:gid`). Anything else is unchanged.
pub(super) fn podman_tmpfs(path: &str, options: &str, user: &str) -> Result<String, String> {
    let (mut uid, mut gid) = (None, None);
    let mut kept: Vec<&str> = Vec::new();
    for o in options.split(',') {
        if let Some(v) = o.strip_prefix("uid=") {
            uid = Some(v);
        } else if let Some(v) = o.strip_prefix("gid=") {
            gid = Some(v);
        } else {
            kept.push(o);
        }
    }
    if uid.is_none() && gid.is_none() {
        return Ok(options.to_string());
    }
    let (user_uid, user_gid) = user.split_once(':').unwrap_or((user, user));
    if uid.unwrap_or(user_uid) != user_uid || gid.unwrap_or(user_gid) != user_gid {
        return Err(format!(
            "the daemon is Podman, which cannot give the tmpfs at {path} to uid {} gid {} \
             (it takes no uid= or gid= option, only U: the container's user, here {user})",
            uid.unwrap_or("-"),
            gid.unwrap_or("-")
        ));
    }
    kept.push("U");
    Ok(kept.join(","))
}

/// Whether a daemon's version answer is Podman's (its components name "Podman Engine").
pub(super) fn is_podman<'a>(component_names: impl IntoIterator<Item = &'a str>) -> bool {
    component_names
        .into_iter()
        .any(|n| n.to_ascii_lowercase().contains("podman"))
}

/// Podman's answer to a container update when its API has none.
pub(super) const NO_UPDATE: &str = "the daemon is Podman, whose Docker-compatible API cannot \
     change a started container's limits (no /containers/{id}/update)";

/// Whether an update's 404 is Podman's missing route rather than a missing container.
pub(super) fn is_missing_route(status: u16, message: &str) -> bool {
    status == 404 && !message.to_ascii_lowercase().contains("no such")
}

/// Whether the daemon's address is a socket on this host.
fn is_local(address: &str) -> bool {
    address.starts_with("unix://") || address.starts_with('/')
}

/// The form for a daemon at `address`, writing the profile file under codebox's data folder
/// `data_dir` where it is Podman on this host.
pub(super) fn seccomp_form(
    podman: bool,
    address: &str,
    profile: &str,
    data_dir: &Path,
) -> SeccompForm {
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
    let dir = data_dir.join(PROFILE_DIR);
    match write_profile(profile, &dir) {
        Ok(path) => SeccompForm::File(path),
        Err(e) => SeccompForm::Refused(format!(
            "the daemon is Podman, which reads the seccomp profile from a file, and codebox \
             could not write it into {}: {e} (data_dir must be a folder codebox can write and \
             Podman can read)",
            dir.display()
        )),
    }
}

/// The folder under codebox's data folder that holds the profile file.
const PROFILE_DIR: &str = "seccomp";

/// Write the profile to `dir/codebox-seccomp-<hash>.json`.
///
/// # Security
/// Podman reads the file again at every create, so nobody but codebox's user may be able to
/// change it: `dir` is made 0700 and is used only when that user owns it and nobody else may
/// enter it, nor rename it (its parent is that user's or root's, and nobody else's to write);
/// the file is created exclusively under a fresh name there and renamed into
/// place. An existing file is reused only when that user owns it, nobody else may write it
/// and it holds this very profile. Podman on this host runs as root or as codebox's user.
fn write_profile(profile: &str, dir: &Path) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true).mode(0o700);
    builder.create(dir)?;
    if let Some(parent) = dir.parent() {
        steady_parent(&std::fs::metadata(parent)?, me)?;
    }
    private_dir(&std::fs::symlink_metadata(dir)?, me)?;
    let hash = Sha256::digest(profile.as_bytes());
    let name: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("codebox-seccomp-{name}.json"));
    let reusable = std::fs::symlink_metadata(&path).is_ok_and(|m| trusted_file(&m, me))
        && std::fs::read_to_string(&path).is_ok_and(|old| old == profile);
    if reusable {
        return Ok(path);
    }
    let tmp = dir.join(format!(
        ".codebox-seccomp-{name}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(profile.as_bytes())?;
            f.set_permissions(std::fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// `Ok` when the metadata is of a folder that `uid` owns and nobody else may enter or write.
fn private_dir(meta: &std::fs::Metadata, uid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    if meta.file_type().is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0 {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "it must be a folder of uid {uid}'s own with mode 0700, and is {} of uid {} with mode {:o}",
            if meta.file_type().is_dir() { "a folder" } else { "not a folder" },
            meta.uid(),
            meta.mode() & 0o7777
        ),
    ))
}

/// `Ok` when the metadata is of a folder where only `uid` or root may rename what it holds.
fn steady_parent(meta: &std::fs::Metadata, uid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    if meta.file_type().is_dir()
        && (meta.uid() == uid || meta.uid() == 0)
        && meta.mode() & 0o022 == 0
    {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "its parent must be a folder of uid {uid} or root that nobody else may write, and is of uid {} with mode {:o}",
            meta.uid(),
            meta.mode() & 0o7777
        ),
    ))
}

/// Whether the metadata is of a regular file that `uid` owns and nobody else may write.
fn trusted_file(meta: &std::fs::Metadata, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    meta.file_type().is_file() && meta.uid() == uid && meta.mode() & 0o022 == 0
}

/// The security options with the inline seccomp profile replaced by `file`.
fn with_profile_file(options: &[String], file: &Path) -> Vec<String> {
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
    use std::collections::BTreeMap;

    #[test]
    fn podman_is_not_asked_for_a_runtime_it_would_not_give() {
        let podman = Dialect {
            podman: true,
            seccomp: SeccompForm::File("/tmp/p.json".into()),
            default_runtime: "crun".into(),
        };
        let mut spec = run_spec(10016);
        spec.runtime = "runsc".into();
        let why = podman.create_body(&spec).expect_err("refused");
        assert!(why.contains("runtime `runsc` cannot be honoured"), "{why}");
        spec.runtime = "runc".into();
        assert!(podman.create_body(&spec).is_ok());
        // Docker takes the runtime a container names.
        spec.runtime = "runsc".into();
        let body = Dialect::docker().create_body(&spec).unwrap();
        assert_eq!(body.host_config.unwrap().runtime.as_deref(), Some("runsc"));
    }

    #[test]
    fn an_update_route_podman_lacks_is_told_from_a_missing_container() {
        // What Podman 4.3 answers to POST /containers/{id}/update, and to a missing container.
        assert!(is_missing_route(404, "Not Found\n"));
        assert!(!is_missing_route(404, "no such container"));
        assert!(!is_missing_route(409, "Not Found"));
    }

    /// The locked-down spec of a run container, as the executor builds it.
    fn run_spec(uid: u32) -> ContainerSpec {
        let plan = crate::engine::posture::Plan {
            name: "codebox-r1-run".into(),
            image: "codebox/bash:5.2".into(),
            uid,
            limits: crate::engine::posture::Limits {
                memory_mb: 256,
                cpus: 1.0,
            },
            workspace_mb: 64,
            labels: BTreeMap::new(),
        };
        crate::engine::posture::locked_down(&plan, &crate::config::SandboxSettings::default())
    }

    fn workspace_options(body: &ContainerCreateBody) -> String {
        let tmpfs = body.host_config.as_ref().unwrap().tmpfs.as_ref().unwrap();
        tmpfs[crate::engine::posture::WORKSPACE].clone()
    }

    #[test]
    fn the_working_directory_goes_to_the_sandbox_user_on_docker_by_uid_and_on_podman_by_u() {
        let spec = run_spec(10016);
        let docker = Dialect::docker().create_body(&spec).unwrap();
        let mut d: Vec<String> = workspace_options(&docker)
            .split(',')
            .map(String::from)
            .collect();
        d.sort();
        assert_eq!(
            d,
            [
                "exec",
                "gid=10016",
                "mode=0755",
                "nodev",
                "nosuid",
                "rw",
                "size=64m",
                "uid=10016"
            ]
        );
        let podman = Dialect {
            podman: true,
            seccomp: SeccompForm::File("/tmp/p.json".into()),
            default_runtime: "crun".into(),
        }
        .create_body(&spec)
        .unwrap();
        let mut p: Vec<String> = workspace_options(&podman)
            .split(',')
            .map(String::from)
            .collect();
        p.sort();
        // The same mount, owned by the container's user (10016:10016), said as Podman takes it.
        assert_eq!(
            p,
            [
                "U",
                "exec",
                "mode=0755",
                "nodev",
                "nosuid",
                "rw",
                "size=64m"
            ]
        );
        let host = podman.host_config.as_ref().unwrap();
        assert_eq!(podman.user.as_deref(), Some("10016:10016"));
        assert_eq!(
            host.security_opt.as_ref().unwrap(),
            &vec![
                "no-new-privileges".to_string(),
                "seccomp=/tmp/p.json".to_string()
            ]
        );
        // No swappiness for Podman, and still no swap: memory+swap equals memory.
        assert_eq!(host.memory_swappiness, None);
        assert_eq!(host.memory_swap, host.memory);
        assert!(host.memory.is_some_and(|m| m > 0));
        // Everything else in the body is Docker's.
        let mut same = podman.clone();
        same.host_config.as_mut().unwrap().memory_swappiness =
            docker.host_config.as_ref().unwrap().memory_swappiness;
        same.host_config.as_mut().unwrap().tmpfs =
            docker.host_config.as_ref().unwrap().tmpfs.clone();
        same.host_config.as_mut().unwrap().security_opt =
            docker.host_config.as_ref().unwrap().security_opt.clone();
        assert_eq!(same, docker);
    }

    #[test]
    fn a_tmpfs_for_another_user_than_the_containers_is_refused_on_podman() {
        assert_eq!(
            podman_tmpfs("/tmp", "rw,noexec,size=8m,mode=1777", "10001:10001").unwrap(),
            "rw,noexec,size=8m,mode=1777"
        );
        let why = podman_tmpfs("/w", "rw,uid=0,gid=0", "10001:10001").unwrap_err();
        assert!(why.contains("Podman") && why.contains("/w"), "{why}");
        assert!(podman_tmpfs("/w", "rw,uid=10001", "10001:10002").is_ok());
        assert!(podman_tmpfs("/w", "rw,gid=5", "10001:10002").is_err());
    }

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
    fn a_profile_file_or_folder_others_could_write_is_never_trusted() {
        use std::os::unix::fs::PermissionsExt as _;
        let data = tempfile::tempdir().unwrap();
        let profile = r#"{"defaultAction":"SCMP_ACT_ERRNO"}"#;
        let form = || seccomp_form(true, "unix:///run/podman/podman.sock", profile, data.path());
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        let SeccompForm::File(path) = form() else {
            panic!("Podman on a local socket must get a file");
        };
        // In a folder of codebox's own under its data folder, that only codebox can enter.
        let dir = path.parent().unwrap().to_path_buf();
        assert_ne!(dir, data.path());
        assert!(dir.starts_with(data.path()));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&path), 0o644);
        // A file with the same content that others could rewrite is replaced, not reused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(form(), SeccompForm::File(path.clone()));
        assert_eq!(mode(&path), 0o644);
        // A link planted in its place is replaced by a file of codebox's own.
        let elsewhere = data.path().join("elsewhere.json");
        std::fs::write(&elsewhere, profile).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert_eq!(form(), SeccompForm::File(path.clone()));
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_file());
        // A folder others could write into is refused, whatever it holds.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let SeccompForm::Refused(why) = form() else {
            panic!("a folder others can write must not be trusted");
        };
        assert!(why.contains(&dir.display().to_string()), "{why}");
        // A data folder others may write (they could rename the folder away) is refused too.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(form(), SeccompForm::Refused(_)));
        std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(form(), SeccompForm::File(path.clone()));
        // Owned by another user: neither the folder nor the file is trusted.
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let dir_meta = std::fs::symlink_metadata(&dir).unwrap();
        let file_meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(private_dir(&dir_meta, me).is_ok());
        assert!(private_dir(&dir_meta, me + 1).is_err());
        assert!(trusted_file(&file_meta, me));
        assert!(!trusted_file(&file_meta, me + 1));
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
