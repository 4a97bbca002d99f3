//! [`ProcessCredentials`]: a profile's `credential_process`, run for the S3 client's keys.
//!
//! The protocol (AWS CLI user guide, "Sourcing credentials with an external process"): the
//! command prints one JSON object, `{"Version": 1, "AccessKeyId", "SecretAccessKey",
//! "SessionToken"?, "Expiration"?}` with `Expiration` an RFC 3339 time; without it the keys do
//! not expire. cdcd runs it when the client first signs a request and again 5 minutes before the
//! keys expire (the SDKs' refresh margin), one run at a time. The command line is handed to
//! `/bin/sh -c` (the AWS CLI splits it shell-like itself; a plain `program --arg value` means
//! the same to both). Its stderr goes to cdcd's, as in the CLI; its stdout holds the secret and is
//! never shown, not even in errors (which name the profile and the failure only).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use object_store::aws::AwsCredential;
use object_store::CredentialProvider;
use serde::Deserialize;
use tokio::sync::Mutex;

/// Refresh this long before `Expiration`.
const MARGIN: Duration = Duration::from_secs(300);
/// A command that has not answered by then is killed and the request fails (object_store retries).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The process's output (field names as the protocol spells them).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Output {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

/// Keys and when to run the command again (`None`: never).
type Cached = (Arc<AwsCredential>, Option<DateTime<Utc>>);

/// The command of one profile, and its last answer.
pub struct ProcessCredentials {
    command: String,
    profile: String,
    cached: Mutex<Option<Cached>>,
}

impl fmt::Debug for ProcessCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessCredentials")
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("credential_process of profile {profile:?}: {detail}")]
struct ProcessError {
    profile: String,
    detail: String,
}

impl ProcessCredentials {
    pub fn new(command: String, profile: String) -> ProcessCredentials {
        ProcessCredentials {
            command,
            profile,
            cached: Mutex::new(None),
        }
    }

    fn failed(&self, detail: String) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(ProcessError {
                profile: self.profile.clone(),
                detail,
            }),
        }
    }

    async fn run(&self) -> Result<Cached, object_store::Error> {
        let child = tokio::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(RUN_TIMEOUT, child)
            .await
            .map_err(|_| self.failed(format!("no answer within {RUN_TIMEOUT:?}")))?
            .map_err(|e| self.failed(format!("cannot run it: {e}")))?;
        if !out.status.success() {
            return Err(self.failed(format!("exited with {} (its stderr is above)", out.status)));
        }
        parse(&out.stdout, Utc::now()).map_err(|d| self.failed(d))
    }
}

/// The keys in `stdout` and when to refresh them, given the time `now`. Pure.
fn parse(stdout: &[u8], now: DateTime<Utc>) -> Result<Cached, String> {
    // serde's message would quote the output: only say where it went wrong.
    let out: Output = serde_json::from_slice(stdout).map_err(|e| {
        format!(
            "its output is not the JSON object of the protocol (line {}, column {}: {:?})",
            e.line(),
            e.column(),
            e.classify()
        )
    })?;
    if out.version != 1 {
        return Err(format!("Version {} (cdcd reads Version 1)", out.version));
    }
    let refresh = match &out.expiration {
        None => None,
        Some(text) => {
            let at = DateTime::parse_from_rfc3339(text)
                .map_err(|e| format!("Expiration is not an RFC 3339 time: {e}"))?
                .with_timezone(&Utc);
            if at <= now {
                return Err("the keys it printed have already expired".into());
            }
            let margin = chrono::Duration::from_std(MARGIN).unwrap_or_default();
            Some(at - margin)
        }
    };
    let credential = AwsCredential {
        key_id: out.access_key_id,
        secret_key: out.secret_access_key,
        token: out.session_token,
    };
    Ok((Arc::new(credential), refresh))
}

#[async_trait]
impl CredentialProvider for ProcessCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        if let Some((credential, refresh)) = cached.as_ref() {
            if refresh.is_none_or(|at| Utc::now() < at) {
                return Ok(Arc::clone(credential));
            }
        }
        let fresh = self.run().await?;
        let credential = Arc::clone(&fresh.0);
        *cached = Some(fresh);
        Ok(credential)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn reads_the_protocol_and_refreshes_before_expiry() {
        let out = br#"{"Version": 1, "AccessKeyId": "AKID", "SecretAccessKey": "s3cr3t",
            "SessionToken": "tok", "Expiration": "2026-12-01T13:00:00Z"}"#;
        let (c, refresh) = parse(out, now()).unwrap();
        assert_eq!(
            (c.key_id.as_str(), c.token.as_deref()),
            ("AKID", Some("tok"))
        );
        assert_eq!(refresh.unwrap().to_rfc3339(), "2026-12-01T12:55:00+00:00");
        let forever = br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S"}"#;
        assert_eq!(parse(forever, now()).unwrap().1, None);
    }

    #[test]
    fn bad_output_is_refused_without_showing_it() {
        let e = parse(b"AKID s3cr3t", now()).unwrap_err();
        assert!(!e.contains("s3cr3t") && e.contains("not the JSON"), "{e}");
        let e = parse(
            br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": 5}"#,
            now(),
        )
        .unwrap_err();
        assert!(e.contains("not the JSON"), "{e}");
        let v2 = br#"{"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "S"}"#;
        assert!(parse(v2, now()).unwrap_err().contains("Version 2"));
        let old = br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S",
            "Expiration": "2026-12-01T11:00:00Z"}"#;
        assert!(parse(old, now()).unwrap_err().contains("expired"));
    }

    #[tokio::test]
    async fn runs_the_command_once_while_the_keys_last() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let command = format!(
            "echo run >> '{}'; echo '{{\"Version\": 1, \"AccessKeyId\": \"PK\", \"SecretAccessKey\": \"S\"}}'",
            count.display()
        );
        let p = ProcessCredentials::new(command, "x".into());
        assert_eq!(p.get_credential().await.unwrap().key_id, "PK");
        assert_eq!(p.get_credential().await.unwrap().key_id, "PK");
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);

        let failing = ProcessCredentials::new("echo SECRET; exit 3".into(), "x".into());
        let e = failing.get_credential().await.unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.contains("exit status: 3"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
    }
}
