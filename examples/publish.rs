//! Publishes messages, as a producer would, for trying dlqctl out:
//!
//! ```text
//! cargo run --example publish -- EXCHANGE ROUTING_KEY BODY [BODY...]
//! ```
//!
//! Each message is persistent, has a message id, and is confirmed.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: publish EXCHANGE ROUTING_KEY BODY [BODY...]");
        std::process::exit(2);
    }
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| dlqctl::DEFAULT_AMQP_URL.into());
    let conn = Connection::connect(
        &url,
        ConnectionProperties::default().with_connection_name("dlqctl example publish".into()),
    )
    .await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    for (i, body) in args[2..].iter().enumerate() {
        let id = format!("demo-{}-{i}", std::process::id());
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("text/plain".into())
            .with_message_id(id.clone().into());
        let confirm = ch
            .basic_publish(
                args[0].as_str().into(),
                args[1].as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body.as_bytes(),
                props,
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) => println!("published {id}: {body}"),
            other => {
                eprintln!("not routed or refused: {other:?}");
                std::process::exit(1);
            }
        }
    }
    conn.close(200, "bye".into()).await?;
    Ok(())
}
