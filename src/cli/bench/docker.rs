//! The baseline: `docker run --rm` with the docker CLI, the same image, the equivalent
//! lockdown flags and runtime. The one place codebox runs the docker CLI: it is what codebox
//! is compared with, never part of a run.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::app::App;
use crate::registry::Language;

/// The docker CLI flags equivalent to codebox's container spec.
pub struct Docker {
    flags: Vec<String>,
    /// `DOCKER_HOST` and friends, so the CLI talks to the daemon codebox talks to.
    env: Vec<(&'static str, String)>,
    workspace_mb: u64,
    /// codebox's seccomp profile as a file for `--security-opt seccomp=FILE`; removed on drop.
    seccomp: PathBuf,
}

impl Drop for Docker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.seccomp);
    }
}

impl Docker {
    pub fn new(app: &App) -> anyhow::Result<Docker> {
        let s = &app.config.sandbox;
        let seccomp = app
            .config
            .data_dir
            .join(format!("bench-seccomp-{}.json", std::process::id()));
        let profile = crate::engine::seccomp::security_opt()
            .strip_prefix("seccomp=")
            .unwrap_or_default()
            .to_string();
        std::fs::create_dir_all(&app.config.data_dir)?;
        std::fs::write(&seccomp, profile)
            .with_context(|| format!("cannot write {}", seccomp.display()))?;
        let memory = app.config.limits.default_memory_mb;
        let scratch = s.tmpfs_mb.min(memory);
        let file_size = s.max_file_size_mb * 1024 * 1024;
        let flags = [
            "--rm",
            "--network=none",
            "--read-only",
            "--user=10001:10001",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            &format!("--security-opt=seccomp={}", seccomp.display()),
            &format!("--pids-limit={}", s.pids_limit),
            &format!("--memory={memory}m"),
            &format!("--memory-swap={memory}m"),
            &format!("--cpus={}", app.config.limits.default_cpus),
            &format!("--tmpfs=/tmp:rw,noexec,nosuid,nodev,size={scratch}m"),
            &format!("--shm-size={scratch}m"),
            &format!("--ulimit=fsize={file_size}:{file_size}"),
            "--ulimit=nofile=1024:1024",
            "--ulimit=core=0",
            "--ipc=private",
            "--hostname=sandbox",
            "--log-driver=none",
            "--workdir=/workspace",
            &format!("--runtime={}", s.runtime),
        ]
        .iter()
        .map(|f| f.to_string())
        .collect();
        Ok(Docker {
            flags,
            env: app.config.docker.cli_env(),
            workspace_mb: s.workspace_mb,
            seccomp,
        })
    }

    async fn docker(
        &self,
        args: &[String],
        stdin: Option<&str>,
    ) -> anyhow::Result<std::process::Output> {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(args)
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .envs(self.env.iter().cloned())
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .context("cannot run the docker CLI (the baseline)")?;
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            use tokio::io::AsyncWriteExt;
            input.write_all(text.as_bytes()).await?;
        }
        Ok(child.wait_with_output().await?)
    }

    /// One run the docker CLI way; returns whether the program exited 0. The code goes in on
    /// stdin; a language's syntax check is left out (a plain `docker run` would not do it).
    pub async fn run(&self, lang: &Language, code: &str) -> anyhow::Result<bool> {
        let quote = |cmd: &[String]| {
            cmd.iter()
                .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let script = |cmd: &[String]| format!("cat > {} && exec {}", lang.source_file, quote(cmd));
        let env: Vec<String> = lang
            .env
            .iter()
            .map(|(k, v)| format!("--env={k}={v}"))
            .collect();
        let Some(compile) = &lang.compile else {
            let mut args = vec!["run".to_string(), "-i".to_string()];
            args.extend(self.flags.iter().cloned());
            args.extend(env);
            args.push(format!(
                "--tmpfs=/workspace:rw,exec,nosuid,nodev,size={}m",
                self.workspace_mb
            ));
            args.extend([
                lang.image.tag.clone(),
                "sh".into(),
                "-c".into(),
                script(&lang.run),
            ]);
            return Ok(self.docker(&args, Some(code)).await?.status.success());
        };
        let volume = format!("codebox-bench-{}", uuid::Uuid::new_v4().simple());
        self.docker(&["volume".into(), "create".into(), volume.clone()], None)
            .await?;
        let mount = |ro: bool| {
            format!(
                "--volume={volume}:/workspace{}",
                if ro { ":ro" } else { "" }
            )
        };
        let mut c = vec!["run".to_string(), "-i".to_string()];
        c.extend(self.flags.iter().cloned());
        c.extend(env.iter().cloned());
        c.push(mount(false));
        c.extend([
            lang.image.tag.clone(),
            "sh".into(),
            "-c".into(),
            script(compile),
        ]);
        let compiled = self
            .docker(&c, Some(code))
            .await
            .map(|o| o.status.success());
        let mut ok = false;
        if matches!(compiled, Ok(true)) {
            let mut r = vec!["run".to_string()];
            r.extend(self.flags.iter().cloned());
            r.extend(env);
            r.push(mount(true));
            r.push(lang.image.tag.clone());
            r.extend(lang.run.iter().cloned());
            ok = self.docker(&r, None).await?.status.success();
        }
        self.docker(&["volume".into(), "rm".into(), "-f".into(), volume], None)
            .await?;
        compiled?;
        Ok(ok)
    }
}
