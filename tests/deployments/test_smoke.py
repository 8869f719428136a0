def test_health(client, db):
    assert client.get("/healthz").json() == {"status": "ok"}
