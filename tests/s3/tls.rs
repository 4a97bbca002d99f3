//! S3 over https with a private CA (the test bed's `mototls`: moto behind a certificate signed by
//! the test CA, for DNS:localhost only). With `sink.s3.ca_file` the rows land and DuckDB and
//! pyiceberg, trusting the same CA, read them back equal. Without it (and with the wrong CA through
//! `AWS_CA_BUNDLE`) cdcd stops with an error that names the endpoint and `sink.s3.ca_file`, and
//! writes nothing.

use std::time::Duration;

use super::access::S3Custom;
use crate::support::ground::var;
use crate::support::s3::{bucket_name, create_bucket_trusting};
use crate::support::{exec, fresh_table, test_env, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_https_with_ca_file_reads_back_and_without_it_stops_clearly() {
    let test = "s3_https_with_ca_file_reads_back_and_without_it_stops_clearly";
    let Some(env) = test_env(test) else { return };
    let (Some(endpoint), Some(ca), Some(other_ca)) = (
        var(test, "CDCD_TEST_S3_TLS"),
        var(test, "CDCD_TEST_S3_TLS_CA"),
        var(test, "CDCD_TEST_S3_TLS_OTHER_CA"),
    ) else {
        return;
    };
    let n = unique("s3tls");
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, name text, qty numeric(10,2));
             INSERT INTO {n} SELECT g, 'n' || g, g / 4.0 FROM generate_series(1, 2000) g;"
        )
    })
    .await;
    let bucket = bucket_name(&n);
    create_bucket_trusting(&env, &endpoint, Some(&ca), &bucket);
    let base = format!(
        "endpoint = {endpoint:?}\nregion = \"us-east-1\"\naccess_key_id = \"test\"\n\
         secret_access_key = \"test\""
    );

    // No CA anywhere (the host's AWS_CA_BUNDLE, if any, is emptied): the system roots do not know
    // the test CA.
    let mut s = S3Custom::new(&env, &n, &n, &bucket, &base);
    s.p.env_vars.push(("AWS_CA_BUNDLE".into(), String::new()));
    s.p.start();
    let status = s.p.wait_exit(Duration::from_secs(240)).await;
    let out = s.p.output();
    assert!(!status.success(), "cdcd ran without the CA:\n{out}");
    assert!(
        out.contains(&endpoint)
            && out.contains("sink.s3.ca_file")
            && out.contains("did not verify"),
        "the error should name the endpoint and sink.s3.ca_file:\n{out}"
    );
    assert!(!out.contains("secret_access_key = "), "{out}");

    // The wrong CA through the environment: the same.
    s.p.env_vars = vec![("AWS_CA_BUNDLE".into(), other_ca.clone())];
    s.p.start();
    let status = s.p.wait_exit(Duration::from_secs(240)).await;
    let out = s.p.output();
    let second = out.rsplit("===== cdcd start #2").next().unwrap_or("");
    assert!(!status.success(), "cdcd ran with the wrong CA:\n{out}");
    assert!(
        second.contains(&endpoint) && second.contains("sink.s3.ca_file"),
        "{second}"
    );
    // Nothing was written over a connection that was never trusted.
    let (code, text) = s
        .lakecheck(&n, &endpoint, "duckdb", &[("AWS_CA_BUNDLE", &ca)], 0)
        .await;
    assert_ne!(
        code,
        Some(0),
        "a table exists after refused connections: {text}"
    );

    // With ca_file: the rows land, updates and deletes too, and both readers trust the same CA.
    s.set_section(&format!("{base}\nca_file = {ca:?}"));
    s.p.env_vars.clear();
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    exec(
        &client,
        &format!(
            "UPDATE {n} SET qty = qty + 1 WHERE id % 5 = 0;
             DELETE FROM {n} WHERE id % 13 = 0;
             INSERT INTO {n} SELECT g, 'late' || g, 2 FROM generate_series(2001, 2300) g;"
        ),
    )
    .await;
    let trust = [("AWS_CA_BUNDLE", ca.as_str())];
    s.assert_equal(&n, &endpoint, "duckdb", &trust).await;
    s.assert_equal(&n, &endpoint, "pyiceberg", &trust).await;
    s.p.assert_running();
    s.p.sigterm_and_wait(Duration::from_secs(60)).await;
}
