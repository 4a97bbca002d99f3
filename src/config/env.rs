//! The `CDCD_<SECTION>__<KEY>` environment overrides as a figment provider that keeps text keys
//! as text.
//!
//! figment's own `Env` parses every value (`"12345"` becomes a number, `"true"` a bool, `"[a]"` an
//! array), so `CDCD_SOURCE__PASSWORD=12345` reached the password field as a number and was
//! refused, and a password like `0123` would have lost its leading zero. Deciding by the target
//! field's type is not possible here: `[source]` and `[sink]` are serde enums tagged by `kind`,
//! which serde buffers before the field types are known. So the keys whose values are text are
//! listed ([`TEXT_KEYS`]); every other value is parsed as figment does (numbers, bools, lists).

use figment::providers::Env;
use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};

/// Config keys (the last part of `section.key`) whose values are text, taken as written.
pub(super) const TEXT_KEYS: &[&str] = &[
    // [pipeline], [metrics]
    "name",
    "spill_dir",
    "listen",
    // [source]
    "url",
    "password",
    "slot",
    "publication",
    "start_position",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "ssl_mode",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
    // [sink], [sink.s3]
    "warehouse",
    "namespace",
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "ca_file",
    "addressing",
    "profile",
];

/// `CDCD_<SECTION>__<KEY>` variables only: other `CDCD_*` variables (`CDCD_LOG`, a test bed's
/// settings) are not configuration keys.
#[derive(Debug)]
pub(super) struct SectionEnv(Env);

impl SectionEnv {
    pub fn new() -> SectionEnv {
        SectionEnv(
            Env::prefixed("CDCD_")
                .filter(|key| {
                    let key = key.as_str().to_ascii_lowercase();
                    ["pipeline__", "source__", "sink__", "metrics__"]
                        .iter()
                        .any(|section| key.starts_with(section))
                })
                .split("__"),
        )
    }
}

impl Provider for SectionEnv {
    fn metadata(&self) -> Metadata {
        self.0.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        let mut dict = Dict::new();
        for (key, text) in self.0.iter() {
            let path: Vec<&str> = key.as_str().split('.').collect();
            let value = match path.last() {
                Some(last) if TEXT_KEYS.contains(last) => Value::from(text),
                _ => {
                    let Ok(parsed) = text.parse::<Value>();
                    parsed
                }
            };
            insert(&mut dict, &path, value);
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Sets `path` in `dict` to `value`, creating the sections on the way.
fn insert(dict: &mut Dict, path: &[&str], value: Value) {
    match path {
        [] => {}
        [key] => {
            dict.insert((*key).to_owned(), value);
        }
        [section, rest @ ..] => {
            let entry = dict
                .entry((*section).to_owned())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)]
    fn text_keys_stay_text_and_others_are_parsed() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("CDCD_SOURCE__PASSWORD", "0123");
            jail.set_env("CDCD_SOURCE__SERVER_ID", "42");
            jail.set_env("CDCD_SINK__S3__SECRET_ACCESS_KEY", "true");
            jail.set_env("CDCD_SINK__S3__ALLOW_HTTP", "true");
            jail.set_env("CDCD_LOG", "debug");
            let data = SectionEnv::new().data().unwrap();
            let dict = &data[&Profile::Default];
            let source = dict["source"].as_dict().unwrap();
            assert_eq!(source["password"].as_str(), Some("0123"));
            assert_eq!(source["server_id"].to_u128(), Some(42));
            let s3 = dict["sink"].as_dict().unwrap()["s3"].as_dict().unwrap();
            assert_eq!(s3["secret_access_key"].as_str(), Some("true"));
            assert_eq!(s3["allow_http"].to_bool(), Some(true));
            assert!(!dict.contains_key("log"));
            Ok(())
        });
    }
}
