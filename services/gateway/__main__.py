import sys

from services.gateway.torch_free import keep_torch_out

keep_torch_out(sys.argv[1:])  # before services.gateway.main imports transformers

from services.gateway.main import main  # noqa: E402

sys.exit(main())
