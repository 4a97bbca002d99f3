//! Named profiles from the AWS shared files (`~/.aws/credentials`, `~/.aws/config`): the static
//! keys, region, endpoint and CA bundle of one profile, for [`super::build`].
//!
//! Why not a crate: object_store 0.13 reads no profiles, and `aws-config` (the SDK's loader) pulls
//! in the AWS SDK's HTTP and runtime stack (hundreds of crates) to read two small text files. The
//! INI crates do not know the files' two AWS rules (`[profile name]` in `config` but `[name]` in
//! `credentials`, and indented sub-settings under a key with an empty value), so this module reads
//! the documented format itself ("Configuration and credential file settings" in the AWS CLI user
//! guide):
//! - `[section]` lines; `#` or `;` at the start of a line is a comment (no inline comments, as
//!   botocore's parser); `key = value` with names case-insensitive, values trimmed.
//! - `config`: `[default]` and `[profile NAME]`; other sections (`[sso-session …]`,
//!   `[services …]`) are skipped. `credentials`: `[NAME]`. For the same key the credentials file
//!   wins, as in the AWS CLI.
//! - An indented line after a key with an empty value (`s3 =` then `  addressing_style = path`)
//!   is a sub-setting of that key; cdcd reads none, and such lines never count as profile keys.
//!
//! Which profile: `[sink.s3] profile`, else `AWS_PROFILE`, else `default`. Files:
//! `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE`, else `$HOME/.aws/credentials` and
//! `$HOME/.aws/config`. A named profile (key or `AWS_PROFILE`) that neither file has is an error;
//! a missing `default` is not (most hosts have no files at all).
//!
//! Supported: `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`,
//! `credential_process` (run by `credential_process.rs` when there are no static keys), `region`,
//! `endpoint_url`, `ca_bundle`. A profile that gets its credentials another way (`role_arn`,
//! `sso_*`, `web_identity_token_file`) and has neither is refused,
//! when its credentials would be used, with the way to export them, rather than silently falling
//! through to another identity.
//! Values are never logged nor put in errors.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The settings of one profile that cdcd uses. `Debug` hides the keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub ca_bundle: Option<String>,
    /// A command printing the keys as JSON; used only without static keys.
    pub credential_process: Option<String>,
    /// The first key naming another way of getting credentials (`role_arn`, `sso_…`, …).
    pub other_source: Option<String>,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("Profile")
            .field("name", &self.name)
            .field("access_key_id", &hidden(&self.access_key_id))
            .field("secret_access_key", &hidden(&self.secret_access_key))
            .field("session_token", &hidden(&self.session_token))
            .field("region", &self.region)
            .field("endpoint_url", &self.endpoint_url)
            .field("ca_bundle", &self.ca_bundle)
            .field(
                "credential_process",
                &self.credential_process.as_ref().map(|_| "…"),
            )
            .field("other_source", &self.other_source)
            .finish()
    }
}

/// Which of the two shared files a text came from: they name sections differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Config,
    Credentials,
}

/// Where the profile name came from, for messages and for whether a missing one is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chosen {
    /// `[sink.s3] profile`.
    Key(String),
    /// `AWS_PROFILE`.
    Env(String),
    /// Neither is set: `default`, if the files have it.
    Default,
}

impl Chosen {
    pub fn name(&self) -> &str {
        match self {
            Chosen::Key(n) | Chosen::Env(n) => n,
            Chosen::Default => "default",
        }
    }

    fn origin(&self) -> &'static str {
        match self {
            Chosen::Key(_) => "sink.s3.profile",
            Chosen::Env(_) => "AWS_PROFILE",
            Chosen::Default => "the default profile",
        }
    }
}

/// The `key = value` lines of each profile section in `text` (keys lowercased). Pure.
pub fn parse(text: &str, kind: FileKind) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut profiles: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    // `None`: outside any profile section (before the first, or in a skipped one).
    let mut current: Option<String> = None;
    // The last key had an empty value: indented lines below it are its sub-settings.
    let mut in_sub_settings = false;
    for raw in text.lines() {
        let indented = raw.starts_with([' ', '\t']);
        let line = raw.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(inner) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = section_profile(inner.trim(), kind);
            in_sub_settings = false;
            if let Some(name) = &current {
                profiles.entry(name.clone()).or_default();
            }
            continue;
        }
        if indented && in_sub_settings {
            continue;
        }
        let Some(name) = &current else { continue };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
        in_sub_settings = value.is_empty();
        if !value.is_empty() {
            if let Some(p) = profiles.get_mut(name) {
                p.insert(key, value.to_owned());
            }
        }
    }
    profiles
}

/// The profile a section header names in a file of `kind`, or `None` for other sections.
fn section_profile(header: &str, kind: FileKind) -> Option<String> {
    match kind {
        FileKind::Credentials => Some(header.to_owned()),
        FileKind::Config => {
            if header == "default" {
                return Some(header.to_owned());
            }
            let rest = header.strip_prefix("profile")?;
            // `[profile x]`, not `[profilex]`.
            (rest.starts_with([' ', '\t']) && !rest.trim().is_empty())
                .then(|| rest.trim().to_owned())
        }
    }
}

/// Merges the two files' sections for `chosen`: `Ok(None)` when neither has it and that is
/// allowed (the default profile). Pure: `config` and `credentials` are the texts (or `None`
/// when the file does not exist), `files` names them for messages.
pub fn resolve(
    chosen: &Chosen,
    config: Option<&str>,
    credentials: Option<&str>,
    files: &str,
) -> Result<Option<Profile>, String> {
    let name = chosen.name();
    let from_config = config.and_then(|t| parse(t, FileKind::Config).remove(name));
    let from_credentials = credentials.and_then(|t| parse(t, FileKind::Credentials).remove(name));
    if from_config.is_none() && from_credentials.is_none() {
        return match chosen {
            Chosen::Default => Ok(None),
            _ => Err(format!(
                "profile {name:?} ({}) is in neither {files}",
                chosen.origin()
            )),
        };
    }
    let mut keys = from_config.unwrap_or_default();
    keys.extend(from_credentials.unwrap_or_default());
    let take = |k: &str| keys.get(k).cloned();
    let other_source = ["role_arn", "web_identity_token_file"]
        .into_iter()
        .find(|k| keys.contains_key(*k))
        .or_else(|| {
            keys.keys()
                .find(|k| k.starts_with("sso_"))
                .map(|k| k.as_str())
        })
        .map(str::to_owned);
    Ok(Some(Profile {
        name: name.to_owned(),
        access_key_id: take("aws_access_key_id"),
        secret_access_key: take("aws_secret_access_key"),
        session_token: take("aws_session_token"),
        region: take("region"),
        endpoint_url: take("endpoint_url"),
        ca_bundle: take("ca_bundle"),
        credential_process: take("credential_process"),
        other_source,
    }))
}

impl Profile {
    /// Why this profile's credentials cannot be used, when cdcd wants them: only one of the two
    /// keys, or neither keys nor `credential_process` but another way of getting them (which cdcd
    /// does not run). `None`: usable, or the profile has no credentials at all (the next source is
    /// asked).
    pub fn unusable(&self, chosen: &Chosen) -> Option<String> {
        let name = &self.name;
        let origin = chosen.origin();
        if self.access_key_id.is_some() != self.secret_access_key.is_some() {
            return Some(format!(
                "profile {name:?} ({origin}) sets only one of aws_access_key_id and \
                 aws_secret_access_key"
            ));
        }
        match (
            &self.access_key_id,
            &self.credential_process,
            &self.other_source,
        ) {
            (None, None, Some(other)) => Some(format!(
                "profile {name:?} ({origin}) gets its credentials through {other}, which cdcd \
                 does not run: export them (eval \"$(aws configure export-credentials --profile \
                 {name} --format env)\") or give the profile static keys"
            )),
            _ => None,
        }
    }
}

/// The two files' paths from the environment (`var` reads one variable).
pub fn file_paths(var: impl Fn(&str) -> Option<String>) -> (Option<PathBuf>, Option<PathBuf>) {
    let home = var("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let pick = |env: &str, default: &str| {
        var(env)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
    };
    (
        pick("AWS_CONFIG_FILE", "config"),
        pick("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
    )
}

/// Reads the files and resolves `chosen`. A file that does not exist counts as empty; one that
/// exists but cannot be read is an error.
pub fn load(
    chosen: &Chosen,
    config_file: Option<&Path>,
    credentials_file: Option<&Path>,
) -> Result<Option<Profile>, String> {
    let read = |path: Option<&Path>| -> Result<Option<String>, String> {
        let Some(path) = path else { return Ok(None) };
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    };
    let show = |p: Option<&Path>| p.map_or("(no $HOME)".to_owned(), |p| p.display().to_string());
    let files = format!("{} nor {}", show(credentials_file), show(config_file));
    resolve(
        chosen,
        read(config_file)?.as_deref(),
        read(credentials_file)?.as_deref(),
        &files,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
# a comment
[default]
region = eu-west-1

[profile minio]
region=us-east-1
endpoint_url = https://minio.internal:9000
ca_bundle = /etc/cdcd/minio-ca.pem
s3 =
  addressing_style = path
  region = not-this-one
output = json

[sso-session corp]
sso_region = us-east-1

[profile sso]
sso_session = corp
sso_account_id = 1234

[profilebroken]
region = nowhere
";

    const CREDENTIALS: &str = "\
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = defaultsecret

[minio]
; the MinIO service account
AWS_ACCESS_KEY_ID = minioid
aws_secret_access_key = minio/secret+with=equals
aws_session_token = tok
";

    fn key(n: &str) -> Chosen {
        Chosen::Key(n.into())
    }

    #[test]
    fn config_sections_need_the_profile_prefix_and_credentials_do_not() {
        let config = parse(CONFIG, FileKind::Config);
        assert_eq!(
            config.keys().collect::<Vec<_>>(),
            ["default", "minio", "sso"]
        );
        let creds = parse(CREDENTIALS, FileKind::Credentials);
        assert_eq!(creds.keys().collect::<Vec<_>>(), ["default", "minio"]);
        // A value keeps every '=' after the first; names are case-insensitive.
        assert_eq!(
            creds["minio"]["aws_secret_access_key"],
            "minio/secret+with=equals"
        );
        assert_eq!(creds["minio"]["aws_access_key_id"], "minioid");
    }

    #[test]
    fn sub_settings_are_not_profile_keys() {
        let config = parse(CONFIG, FileKind::Config);
        assert_eq!(config["minio"]["region"], "us-east-1");
        assert_eq!(config["minio"]["output"], "json");
        assert!(!config["minio"].contains_key("addressing_style"));
        assert!(!config["minio"].contains_key("s3"));
    }

    #[test]
    fn both_files_merge_with_credentials_winning() {
        let p = resolve(&key("minio"), Some(CONFIG), Some(CREDENTIALS), "f")
            .unwrap()
            .unwrap();
        assert_eq!(p.access_key_id.as_deref(), Some("minioid"));
        assert_eq!(p.session_token.as_deref(), Some("tok"));
        assert_eq!(p.region.as_deref(), Some("us-east-1"));
        assert_eq!(
            p.endpoint_url.as_deref(),
            Some("https://minio.internal:9000")
        );
        assert_eq!(p.ca_bundle.as_deref(), Some("/etc/cdcd/minio-ca.pem"));
        let text = format!("{p:?}");
        assert!(
            !text.contains("minioid") && !text.contains("minio/secret"),
            "{text}"
        );

        let over = "[profile minio]\naws_access_key_id = fromconfig\naws_secret_access_key = s\n";
        let p = resolve(&key("minio"), Some(over), Some(CREDENTIALS), "f")
            .unwrap()
            .unwrap();
        assert_eq!(p.access_key_id.as_deref(), Some("minioid"));
    }

    #[test]
    fn default_profile_is_optional_but_a_named_one_is_not() {
        assert_eq!(resolve(&Chosen::Default, None, None, "f").unwrap(), None);
        let p = resolve(&Chosen::Default, Some(CONFIG), Some(CREDENTIALS), "f")
            .unwrap()
            .unwrap();
        assert_eq!(p.region.as_deref(), Some("eu-west-1"));
        assert_eq!(p.access_key_id.as_deref(), Some("AKIDDEFAULT"));

        let e = resolve(&Chosen::Env("nope".into()), Some(CONFIG), None, "A nor B").unwrap_err();
        assert!(
            e.contains("\"nope\"") && e.contains("AWS_PROFILE") && e.contains("A nor B"),
            "{e}"
        );
        // `[profilebroken]` is not `[profile broken]`.
        assert!(resolve(&key("broken"), Some(CONFIG), None, "f").is_err());
    }

    #[test]
    fn a_profile_with_another_credential_source_is_refused_by_name() {
        let p = resolve(&key("sso"), Some(CONFIG), None, "f")
            .unwrap()
            .unwrap();
        let e = p.unusable(&key("sso")).unwrap();
        assert!(
            e.contains("sso_") && e.contains("export-credentials --profile sso"),
            "{e}"
        );
        let role = "[profile r]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n";
        let p = resolve(&key("r"), Some(role), None, "f").unwrap().unwrap();
        let e = p.unusable(&key("r")).unwrap();
        assert!(
            e.contains("role_arn") && e.contains("sink.s3.profile"),
            "{e}"
        );
        let half = "[h]\naws_access_key_id = only\n";
        let p = resolve(&Chosen::Env("h".into()), None, Some(half), "f")
            .unwrap()
            .unwrap();
        let e = p.unusable(&Chosen::Env("h".into())).unwrap();
        assert!(
            e.contains("only one of") && e.contains("AWS_PROFILE"),
            "{e}"
        );
        assert!(!e.contains("\"only\""), "{e}");
        let process = "[p]\ncredential_process = /opt/get-keys --json\n";
        let p = resolve(&key("p"), None, Some(process), "f")
            .unwrap()
            .unwrap();
        assert_eq!(
            p.credential_process.as_deref(),
            Some("/opt/get-keys --json")
        );
        assert_eq!(p.unusable(&key("p")), None);
        assert!(!format!("{p:?}").contains("get-keys"));
        // Static keys beside a role: the keys are used.
        let both = "[b]\naws_access_key_id = a\naws_secret_access_key = s\nrole_arn = x\n";
        let p = resolve(&key("b"), None, Some(both), "f").unwrap().unwrap();
        assert_eq!(p.unusable(&key("b")), None);
    }

    #[test]
    fn files_come_from_the_environment_or_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let (c, k) = file_paths(env(&[("HOME", "/home/u")]));
        assert_eq!(c.unwrap(), Path::new("/home/u/.aws/config"));
        assert_eq!(k.unwrap(), Path::new("/home/u/.aws/credentials"));
        let (c, k) = file_paths(env(&[
            ("AWS_CONFIG_FILE", "/c"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/k"),
        ]));
        assert_eq!((c.unwrap(), k.unwrap()), ("/c".into(), "/k".into()));
        assert_eq!(file_paths(env(&[])), (None, None));
    }

    #[test]
    fn missing_files_are_empty_and_a_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none");
        assert_eq!(
            load(&Chosen::Default, Some(&none), Some(&none)).unwrap(),
            None
        );
        let e = load(&Chosen::Default, Some(dir.path()), None).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        let creds = dir.path().join("credentials");
        std::fs::write(&creds, CREDENTIALS).unwrap();
        let p = load(&key("minio"), Some(&none), Some(&creds))
            .unwrap()
            .unwrap();
        assert_eq!(p.access_key_id.as_deref(), Some("minioid"));
    }
}
