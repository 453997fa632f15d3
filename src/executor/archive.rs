//! The tar archive that carries code and files into a container's workspace.

use std::collections::BTreeSet;

/// Build a tar of the workspace: the source file and the extra files, every entry owned by
/// the sandbox user (so the compile stage can write next to them).
pub fn workspace_tar(
    source_file: &str,
    code: &str,
    files: &[(String, Vec<u8>)],
    uid: u32,
) -> Vec<u8> {
    let (uid, gid) = (u64::from(uid), u64::from(uid));
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = BTreeSet::new();
    for (path, _) in files {
        let mut prefix = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .iter()
            .rev()
            .skip(1)
            .rev()
        {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            dirs.insert(prefix.clone());
        }
    }
    let entry = |kind: tar::EntryType, size: u64, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(mtime);
        h
    };
    // Writing into a Vec cannot fail.
    for d in &dirs {
        let mut h = entry(tar::EntryType::Directory, 0, 0o755);
        builder
            .append_data(&mut h, format!("{d}/"), std::io::empty())
            .expect("tar into memory");
    }
    let mut all: Vec<(&str, &[u8])> = vec![(source_file, code.as_bytes())];
    all.extend(files.iter().map(|(p, c)| (p.as_str(), c.as_slice())));
    for (path, content) in all {
        let mut h = entry(tar::EntryType::Regular, content.len() as u64, 0o644);
        builder
            .append_data(&mut h, path, content)
            .expect("tar into memory");
    }
    builder.into_inner().expect("tar into memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_tar_holds_source_files_and_their_directories() {
        let tar = workspace_tar(
            "main.py",
            "print(1)",
            &[("data/in.txt".into(), b"x".to_vec())],
            10001,
        );
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut names = Vec::new();
        for e in archive.entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(e.header().uid().unwrap(), 10001);
            names.push(e.path().unwrap().to_string_lossy().into_owned());
        }
        assert_eq!(names, ["data/", "main.py", "data/in.txt"]);
    }
}
