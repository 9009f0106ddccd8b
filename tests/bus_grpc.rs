//! The bus over gRPC with a real tonic client on the server's one
//! listener: publish and subscribe, the KV with wait and compare-and-set,
//! tenants kept apart by their keys, and status codes for bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use conclave::api::grpc::bus::proto::bus_client::BusClient;
use conclave::api::grpc::bus::proto::{
    KvDeleteRequest, KvGetRequest, KvPutRequest, KvWatchRequest, PublishRequest, SubscribeRequest,
    delivery,
};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request};

const KEY_A: &str = "tenant-a-key-1";
const KEY_B: &str = "tenant-b-key-2";

async fn client(server: &TestServer) -> BusClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(server.url(""))
        .unwrap()
        .connect()
        .await
        .unwrap();
    BusClient::new(channel)
}

/// A request carrying `key` as its bearer token.
fn with_key<T>(key: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {key}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    request
}

#[tokio::test]
async fn publish_subscribe_and_kv_over_grpc_per_tenant() {
    let server = TestServer::start_with(|c| {
        c.api_keys = vec![KEY_A.into(), KEY_B.into()];
        c.bus.max_payload_bytes = 1024;
    })
    .await;
    let mut bus = client(&server).await;
    let subscribe = |key: &str, subjects: &[&str], since: &str| {
        with_key(
            key,
            SubscribeRequest {
                subjects: subjects.iter().map(|s| s.to_string()).collect(),
                since: since.into(),
            },
        )
    };
    let mut a_results = bus
        .subscribe(subscribe(KEY_A, &["inference/results/*"], "new"))
        .await
        .unwrap()
        .into_inner();
    let mut b_all = bus
        .subscribe(subscribe(KEY_B, &[">"], "new"))
        .await
        .unwrap()
        .into_inner();
    let publish = |key: &str, subject: &str, payload: &[u8]| {
        with_key(
            key,
            PublishRequest {
                subject: subject.into(),
                payload: payload.to_vec(),
            },
        )
    };
    for i in 1..=3u8 {
        let reply = bus
            .publish(publish(KEY_A, "inference.results.shared", &[i]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.seq, u64::from(i));
    }
    for i in 1..=3u64 {
        let got = tokio::time::timeout(Duration::from_secs(10), a_results.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Some(delivery::Kind::Message(message)) = got.kind else {
            panic!("{got:?}")
        };
        assert_eq!((message.seq, message.payload), (i, vec![i as u8]));
    }
    // B publishes on the same subject: its own seq, only B sees it.
    let b_reply = bus
        .publish(publish(KEY_B, "inference.results.shared", b"b"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b_reply.seq, 1);
    let got = tokio::time::timeout(Duration::from_secs(10), b_all.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(delivery::Kind::Message(message)) = got.kind else {
        panic!("{got:?}")
    };
    assert_eq!(message.payload, b"b");

    // The KV: a waiting get ends when the key is written, for A only.
    let waiting = {
        let mut bus = bus.clone();
        tokio::spawn(async move {
            bus.kv_get(with_key(
                KEY_A,
                KvGetRequest {
                    key: "inference_response_topic".into(),
                    wait_s: 10.0,
                    after: None,
                },
            ))
            .await
        })
    };
    let mut watch = bus
        .kv_watch(with_key(
            KEY_A,
            KvWatchRequest {
                prefix: "inference".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let put = bus
        .kv_put(with_key(
            KEY_A,
            KvPutRequest {
                key: "inference_response_topic".into(),
                value: b"inference/results/shared".to_vec(),
                if_revision: Some(0),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let entry = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(
        (entry.value.as_slice(), entry.revision),
        (&b"inference/results/shared"[..], put.revision)
    );
    let change = watch.message().await.unwrap().unwrap();
    assert_eq!(change.revision, put.revision);
    let again = bus
        .kv_put(with_key(
            KEY_A,
            KvPutRequest {
                key: "inference_response_topic".into(),
                value: b"x".to_vec(),
                if_revision: Some(0),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    let b_get = bus
        .kv_get(with_key(
            KEY_B,
            KvGetRequest {
                key: "inference_response_topic".into(),
                wait_s: 0.0,
                after: None,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(b_get.code(), Code::NotFound);
    let b_delete = bus
        .kv_delete(with_key(
            KEY_B,
            KvDeleteRequest {
                key: "inference_response_topic".into(),
                if_revision: None,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(b_delete.code(), Code::NotFound);

    // Bad input and a missing key get the matching codes.
    let bad_subject = bus.publish(publish(KEY_A, "a..b", b"1")).await.unwrap_err();
    assert_eq!(bad_subject.code(), Code::InvalidArgument, "{bad_subject:?}");
    let too_large = bus
        .publish(publish(KEY_A, "a", &[0; 2048]))
        .await
        .unwrap_err();
    assert_eq!(too_large.code(), Code::ResourceExhausted, "{too_large:?}");
    let bad_pattern = bus
        .subscribe(subscribe(KEY_A, &["a.>.b"], "new"))
        .await
        .unwrap_err();
    assert_eq!(bad_pattern.code(), Code::InvalidArgument);
    let bad_since = bus
        .subscribe(subscribe(KEY_A, &["a"], "yesterday"))
        .await
        .unwrap_err();
    assert_eq!(bad_since.code(), Code::InvalidArgument);
    let anonymous = bus
        .publish(Request::new(PublishRequest {
            subject: "a".into(),
            payload: vec![],
        }))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");
    let wrong_key = bus
        .publish(publish("not-a-key-at-all", "a", b""))
        .await
        .unwrap_err();
    assert_eq!(wrong_key.code(), Code::Unauthenticated);
    drop((a_results, b_all, watch));
    server.stop().await;
}
