"""``python -m dledger``, and the ``dledger`` console script (``main`` here): the command line of ``dledger.cli``,
started after the gRPC settings of ``dledger.grpc_env``, which must come before anything imports gRPC."""

from dledger.grpc_env import prefer_classic_listener

prefer_classic_listener()

from dledger.cli import main  # noqa: E402  (gRPC reads its settings when imported: after the line above)

if __name__ == "__main__":
    main()
