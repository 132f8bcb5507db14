import sys

from services.gateway.torch_free import keep_torch_out

keep_torch_out(sys.argv[1:])  # before services.gateway.main imports transformers

from services.common.prompt_exit import exit_after  # noqa: E402
from services.gateway.main import main  # noqa: E402

exit_after(main)
