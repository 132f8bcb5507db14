from services.cache_store.main import main
from services.common.prompt_exit import exit_after

exit_after(main)
