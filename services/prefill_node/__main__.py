from services.common.prompt_exit import exit_after
from services.prefill_node.main import main

exit_after(main)
