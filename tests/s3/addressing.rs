//! Virtual-hosted addressing against moto: cdcd with `addressing = "virtual-hosted"` and endpoint
//! `http://localhost:<moto>` sends every request to `http://<bucket>.localhost:<moto>/<key>`. No
//! resolver knows `<bucket>.localhost`, so cdcd goes through the fault proxy as a plain HTTP
//! forward proxy (`AWS_PROXY_URL`, faults off), which logs each request's URL and Host header and
//! forwards it to moto; moto routes a `<bucket>.localhost` Host to that bucket. The proof is both:
//! every logged request has the bucket in the host and not in the path, and DuckDB, reading moto
//! path-style without the proxy, finds the table equal.

use std::time::Duration;

use super::access::{LoggingProxy, S3Custom};
use crate::support::s3::{bucket_name, create_bucket, moto_test_env};
use crate::support::{exec, fresh_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_virtual_hosted_requests_put_the_bucket_in_the_host() {
    let (env, moto_url, n) = ground_or_skip!(moto_test_env(false, "s3vh"));
    let port = moto_url.rsplit(':').next().unwrap().to_owned();
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, name text);
             INSERT INTO {n} SELECT g, 'n' || g FROM generate_series(1, 1000) g;"
        )
    })
    .await;
    let bucket = bucket_name(&n);
    create_bucket(&env, &moto_url, &bucket);
    let proxy = LoggingProxy::start(&env.python, &moto_url);
    let section = format!(
        "endpoint = \"http://localhost:{port}\"\naddressing = \"virtual-hosted\"\n\
         region = \"us-east-1\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\""
    );
    let mut s = S3Custom::new(&env, &n, &n, &bucket, &section);
    s.p.env_vars
        .push(("AWS_PROXY_URL".into(), proxy.url.clone()));
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(90)).await;
    exec(
        &client,
        &format!(
            "UPDATE {n} SET name = 'u' || id WHERE id % 3 = 0;
             DELETE FROM {n} WHERE id % 10 = 0;"
        ),
    )
    .await;
    s.assert_equal(&n, &moto_url, "duckdb", &[]).await;
    s.p.sigterm_and_wait(Duration::from_secs(60)).await;

    let requests = proxy.requests();
    assert!(
        requests.len() > 5,
        "too few requests through the proxy: {requests:?}"
    );
    let host = format!("{bucket}.localhost:{port}");
    for (method, url, host_header, _) in &requests {
        let prefix = format!("http://{host}/");
        assert!(
            url.starts_with(&prefix) && host_header == &host,
            "{method} {url} (Host {host_header}) is not virtual-hosted for {bucket}"
        );
        assert!(
            !url[prefix.len()..].starts_with(&format!("{bucket}/")),
            "{method} {url}: the bucket is in the path too"
        );
    }
    // Writes went this way, not only reads.
    assert!(
        requests
            .iter()
            .any(|(m, u, _, _)| m == "PUT" && u.contains("metadata.json")),
        "{requests:?}"
    );
}
