//! The one error type of configuration loading: every connector's `validate()` returns it, so it
//! sits at the bottom of `config/`, importing nothing else of cdcd.

/// A configuration problem, naming the key and where it came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {detail}")]
    Parse { file: String, detail: String },
    #[error("{file}: key `{key}`: {detail}")]
    Invalid {
        file: String,
        key: &'static str,
        detail: String,
    },
}
