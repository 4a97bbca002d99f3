//! Credentials from a profile of the AWS shared files only: no keys in `[sink.s3]` or in the
//! environment, `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` point at temp files, and
//! `AWS_PROFILE=cdcd-test` picks a profile whose keys, region and `endpoint_url` (the logging
//! proxy in front of moto) are all cdcd gets. moto does not check keys, so the proxy's log shows
//! which key id signed each request: the profile's, never the `default` profile's. Then a profile
//! whose keys come from `credential_process` (a script printing the protocol's JSON): every
//! request is signed with the key id the script printed. A profile that is not in the files stops
//! cdcd with a message naming it.

use std::time::Duration;

use super::access::{LoggingProxy, S3Custom};
use crate::support::s3::{bucket_name, create_bucket, moto_test_env};
use crate::support::{exec, fresh_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_credentials_from_an_aws_profile_only() {
    let (env, moto_url, n) = ground_or_skip!(moto_test_env(false, "s3prof"));
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, v text);
             INSERT INTO {n} SELECT g, 'v' || g FROM generate_series(1, 800) g;"
        )
    })
    .await;
    let bucket = bucket_name(&n);
    create_bucket(&env, &moto_url, &bucket);
    let proxy = LoggingProxy::start(&env.python, &moto_url);
    let files = tempfile::tempdir().unwrap();
    let credentials = files.path().join("credentials");
    let config = files.path().join("config");
    std::fs::write(
        &credentials,
        format!("[default]\naws_access_key_id = DEFAULTKEYID\naws_secret_access_key = defaultsecret\n\n\
         [cdcd-test]\naws_access_key_id = PROFILEKEYID\naws_secret_access_key = profilesecret\n\n\
         [cdcd-proc]\ncredential_process = sh {script}\n",
            script = files.path().join("keys.sh").display()
        ),
    )
    .unwrap();
    std::fs::write(
        files.path().join("keys.sh"),
        "echo '{\"Version\": 1, \"AccessKeyId\": \"PROCESSKEYID\", \"SecretAccessKey\": \"procsecret\", \
         \"Expiration\": \"2099-01-01T00:00:00Z\"}'\n",
    )
    .unwrap();
    std::fs::write(
        &config,
        format!(
            "[profile cdcd-test]\nregion = us-east-1\nendpoint_url = {url}\ns3 =\n  addressing_style = path\n\n\
             [profile cdcd-proc]\nregion = us-east-1\nendpoint_url = {url}\n",
            url = proxy.url
        ),
    )
    .unwrap();

    // [sink.s3] says only that plain http is fine; everything else comes from the profile.
    let mut s = S3Custom::new(&env, &n, &n, &bucket, "allow_http = true");
    let base_env = vec![
        (
            "AWS_SHARED_CREDENTIALS_FILE".to_owned(),
            credentials.display().to_string(),
        ),
        ("AWS_CONFIG_FILE".to_owned(), config.display().to_string()),
        // Emptied: the test process's own, if any, must not be used (empty counts as unset).
        ("AWS_ACCESS_KEY_ID".to_owned(), String::new()),
        ("AWS_SECRET_ACCESS_KEY".to_owned(), String::new()),
        ("AWS_SESSION_TOKEN".to_owned(), String::new()),
        ("AWS_ENDPOINT_URL".to_owned(), String::new()),
        ("AWS_REGION".to_owned(), String::new()),
    ];

    // A profile the files do not have: a clear stop, naming it and AWS_PROFILE.
    s.p.env_vars = base_env.clone();
    s.p.env_vars
        .push(("AWS_PROFILE".into(), "no-such-profile".into()));
    s.p.start();
    let status = s.p.wait_exit(Duration::from_secs(60)).await;
    let out = s.p.output();
    assert!(!status.success(), "{out}");
    assert!(
        out.contains("\"no-such-profile\"") && out.contains("AWS_PROFILE"),
        "{out}"
    );
    assert!(
        !out.contains("profilesecret") && !out.contains("defaultsecret"),
        "{out}"
    );

    s.p.env_vars = base_env.clone();
    s.p.env_vars
        .push(("AWS_PROFILE".into(), "cdcd-test".into()));
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    exec(
        &client,
        &format!("UPDATE {n} SET v = 'w' || id WHERE id % 4 = 0;"),
    )
    .await;
    s.assert_equal(&n, &moto_url, "duckdb", &[]).await;
    s.p.sigterm_and_wait(Duration::from_secs(60)).await;

    let requests = proxy.requests();
    assert!(requests.len() > 5, "{requests:?}");
    let keys: std::collections::BTreeSet<&str> =
        requests.iter().map(|(_, _, _, k)| k.as_str()).collect();
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        ["PROFILEKEYID"],
        "requests signed by other keys: {requests:?}"
    );
    let out = s.p.output();
    assert!(!out.contains("profilesecret"), "{out}");

    // The same pipeline on with keys from credential_process.
    proxy.clear();
    s.p.env_vars = base_env;
    s.p.env_vars
        .push(("AWS_PROFILE".into(), "cdcd-proc".into()));
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    exec(&client, &format!("DELETE FROM {n} WHERE id % 9 = 0;")).await;
    s.assert_equal(&n, &moto_url, "duckdb", &[]).await;
    s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    let requests = proxy.requests();
    assert!(requests.len() > 3, "{requests:?}");
    assert!(
        requests.iter().all(|(_, _, _, k)| k == "PROCESSKEYID"),
        "requests signed by other keys: {requests:?}"
    );
    assert!(!s.p.output().contains("procsecret"));
}
